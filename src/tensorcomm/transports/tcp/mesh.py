"""Build the full mesh: every pair of ranks gets one authenticated TCP connection.

Each rank listens on its own address and publishes it in the store; a rank connects to every
lower rank and accepts every higher one. Accepting runs in a thread beside the connects, so no
ordering of arrivals can deadlock. Every link passes the job-secret handshake (``purpose=b"data"``)
bound to the address dialled, both ranks and the scope, so a stranger can neither join nor
impersonate a rank, and a relay put in a rank's place (its address swapped in the store) is
refused; each link's session key seals its frames (``sealing.py``) at the level both ends' wishes
give (the stronger one, sent in the handshake's options). Accepted
connections authenticate concurrently through a ``rendezvous.gate.Gate``, each within
``config.HANDSHAKE_TIMEOUT``: a silent or slow stranger delays no rank, and a flood of them
costs a bounded number of threads (the excess is closed at once; a refused rank retries).
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from ...config import CONNECT_RETRY_INTERVAL, HANDSHAKE_TIMEOUT, SOCKET_BUFFER_BYTES
from ...errors import AuthenticationError, RendezvousError
from ...rendezvous import auth
from ...rendezvous.gate import Gate, describe_error, out_of_descriptors
from ...rendezvous.store import Store
from .sealing import Sealer, configured_level

KEEPALIVE_IDLE_SECONDS = 5
KEEPALIVE_INTERVAL_SECONDS = 2
KEEPALIVE_PROBES = 3
# Linux lets TCP_USER_TIMEOUT override the keep-alive probe count, so it must not be longer
# than the keep-alive verdict (idle + interval x probes) or a vanished host is noticed late.
USER_TIMEOUT_MS = (KEEPALIVE_IDLE_SECONDS + KEEPALIVE_INTERVAL_SECONDS * KEEPALIVE_PROBES) * 1000
_ACCEPT_POLL = 0.05  # seconds; how soon the acceptor notices that set-up is over
log = logging.getLogger("tensorcomm.tcp")


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # A peer whose host vanishes sends no FIN: keep-alive probes (and a bound on unacknowledged
    # data) turn that silence into a closed link, hence a PeerLostError, within seconds.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in ((getattr(socket, "TCP_KEEPIDLE", None), KEEPALIVE_IDLE_SECONDS),
                          (getattr(socket, "TCP_KEEPINTVL", None), KEEPALIVE_INTERVAL_SECONDS),
                          (getattr(socket, "TCP_KEEPCNT", None), KEEPALIVE_PROBES),
                          (getattr(socket, "TCP_USER_TIMEOUT", None), USER_TIMEOUT_MS)):
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)


def _connect(address: str, rank: int, peer: int, secret: bytes, scope: bytes, level: int,
             deadline: float) -> tuple[socket.socket, Sealer]:
    """Dial rank ``peer`` at ``address`` and authenticate, retrying while it does not listen yet
    or is too busy to take the connection."""
    host, port = address.rsplit(":", 1)
    pause = CONNECT_RETRY_INTERVAL
    while True:
        try:
            sock = socket.create_connection((host, int(port)), timeout=max(0.1, deadline - time.monotonic()))
        except OSError as exc:
            if out_of_descriptors(exc):
                raise RendezvousError(f"rank {rank}: cannot connect to peer at {address}: "
                                      f"{describe_error(exc)}") from None
            if time.monotonic() >= deadline:
                raise RendezvousError(f"could not connect to peer at {address}: {exc}") from None
            time.sleep(CONNECT_RETRY_INTERVAL)
            continue
        try:
            _tune(sock)
            session = auth.handshake_client(sock, secret, max(0.1, deadline - time.monotonic()), b"data",
                                            address=address, rank=rank, target=peer, scope=scope,
                                            options=level)
            sealer = Sealer.for_session(session, level)
        except auth.HandshakeRefused:
            sock.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(pause)
            pause = min(2 * pause, 1.0)
            continue
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return sock, sealer


def connect_mesh(rank: int, size: int, store: Store, secret: bytes, host: str, timeout: float,
                 scope: bytes = b"", level: int | None = None) -> dict[int, tuple[socket.socket, Sealer]]:
    """Connect this rank to every other; return ``{peer global rank: (socket, sealer)}``.

    ``scope`` names what the mesh is for (the generation); every rank must pass the same.
    ``level`` is this rank's link protection (default: ``sealing.configured_level()``).

    Raises:
        RendezvousError: a peer could not be reached or did not arrive within ``timeout``, or
            this process ran out of descriptors (the message names the limit).
        AuthenticationError: a link failed the job-secret handshake (a relay in a peer's place,
            or another job's secret).
        ValueError: ``TENSORCOMM_LINK_PROTECTION`` is invalid.
    """
    level = configured_level() if level is None else level
    deadline = time.monotonic() + timeout
    listener = socket.create_server((host, 0), backlog=max(size, 8))
    address = f"{host}:{listener.getsockname()[1]}"
    store.set(f"tcp/addr/{rank}", address.encode())
    acceptor = _Acceptor(listener, rank, size, secret, deadline, address, scope, level)
    links: dict[int, tuple[socket.socket, Sealer]] = {}
    try:
        for peer in range(rank):
            dialled = store.get(f"tcp/addr/{peer}", timeout=max(0.1, deadline - time.monotonic())).decode()
            links[peer] = _connect(dialled, rank, peer, secret, scope, level, deadline)
        links.update(acceptor.result(timeout))
    except BaseException:
        acceptor.close()
        for sock, _ in links.values():
            sock.close()
        raise
    finally:
        listener.close()
    return links


class _Acceptor:
    """Accepts the higher ranks' links in a thread; each connection authenticates through a gate
    (concurrently, within ``config.HANDSHAKE_TIMEOUT``), so a silent stranger delays no rank."""

    def __init__(self, listener: socket.socket, rank: int, size: int, secret: bytes,
                 deadline: float, address: str, scope: bytes, level: int) -> None:
        self._listener, self._rank, self._secret, self._deadline = listener, rank, secret, deadline
        self._address, self._scope, self._level = address, scope, level
        self._expected = set(range(rank + 1, size))
        self._accepted: dict[int, tuple[socket.socket, Sealer]] = {}
        self._error: BaseException | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._done = threading.Event()  # every expected rank is in, or something failed
        if not self._expected:
            self._done.set()
        self._gate = Gate(f"rank {rank} data listener", log)
        self._thread = threading.Thread(target=self._accept, daemon=True, name="tensorcomm-tcp-accept")
        self._thread.start()

    def result(self, timeout: float) -> dict[int, tuple[socket.socket, Sealer]]:
        """Wait for every higher rank; return their sockets (ours from now on).

        Raises:
            RendezvousError: a connection claimed a wrong rank, accepting failed, or ranks are
                missing at the deadline.
        """
        self._done.wait(max(0.0, self._deadline - time.monotonic()) + 1.0)
        self._gate.close()  # strangers still silent are of no more use
        with self._lock:
            self._closed = True
            self._done.set()
            if self._error is not None:
                raise self._error
            missing = sorted(self._expected - set(self._accepted))
            if missing:
                raise RendezvousError(f"rank {self._rank}: ranks {missing} did not connect within "
                                      f"{timeout:g} s")
            return dict(self._accepted)

    def close(self) -> None:
        """Stop accepting and close whatever was accepted."""
        with self._lock:
            self._closed = True
            self._done.set()
            accepted, self._accepted = list(self._accepted.values()), {}
        self._gate.close()
        for sock, _ in accepted:
            sock.close()

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = error
            self._done.set()

    def _accept(self) -> None:
        while not self._done.is_set():
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                return
            self._listener.settimeout(min(remaining, _ACCEPT_POLL))
            try:
                sock, addr = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if out_of_descriptors(exc):
                    self._fail(RendezvousError(f"rank {self._rank}: cannot accept the other ranks' "
                                               f"connections: {describe_error(exc)}"))
                return  # else the listener was closed: set-up is over
            self._gate.admit(sock, f"{addr[0]}:{addr[1]}", self._handshake)

    def _handshake(self, sock: socket.socket, peer: str) -> None:
        limit = min(self._deadline, time.monotonic() + HANDSHAKE_TIMEOUT)
        try:
            _tune(sock)
            session = auth.handshake_server(sock, self._secret, max(0.01, limit - time.monotonic()), b"data",
                                            addresses=(self._address,), rank=self._rank, scope=self._scope,
                                            options=self._level)
            rank, sealer = session.peer_rank, Sealer.for_session(session, self._level)
        except (AuthenticationError, OSError) as exc:
            # A stranger or a broken client: drop it; the real ranks are not kept waiting.
            sock.close()
            log.warning("rank %d: refused a data connection from %s: %s", self._rank, peer, exc)
            return None
        with self._lock:
            if self._closed:
                sock.close()
            elif rank not in self._expected or rank in self._accepted:
                sock.close()
                if self._error is None:
                    self._error = RendezvousError(f"rank {self._rank}: unexpected connection claiming "
                                                  f"rank {rank}")
                self._done.set()
            else:
                sock.settimeout(None)
                self._accepted[rank] = (sock, sealer)
                if len(self._accepted) == len(self._expected):
                    self._done.set()
        return None
