"""The TCP links of one world: a listener that stays open, and dials made at init or when first needed.

Each rank listens on its own address (``Mesh.address``, published by the caller). ``connect``
makes the links set-up needs at once, every lower rank's dialled concurrently and every higher
rank's accepted; ``dial`` makes one later, when the transport first needs it (between ranks on
one host whose groups run on shared memory, most pairs never need one). Accepting runs in a
thread for the world's life, so no ordering of arrivals can deadlock; links a peer makes after
set-up go to the transport (``attach``). Every link passes the job-secret handshake
(``purpose=b"data"``) bound to the address dialled, both ranks and the scope, so a stranger can
neither join nor impersonate a rank, and a relay put in a rank's place (its address swapped in
the store) is refused; each link's session key seals its frames (``sealing.py``) at the level
both ends' wishes give (the stronger one, sent in the handshake's options). Accepted
connections authenticate concurrently through a ``rendezvous.gate.Gate``, each within
``config.HANDSHAKE_TIMEOUT``: a silent or slow stranger delays no rank, and a flood of them
costs a bounded number of threads (the excess is closed at once; a refused rank retries).
A rank dials a peer at most once: two links between a pair (both dialled at once) are both
kept, and each end sends on the first it had (``links.py``).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from ...config import CONNECT_RETRY_INTERVAL, HANDSHAKE_TIMEOUT, SOCKET_BUFFER_BYTES
from ...errors import AuthenticationError, PeerLostError, RendezvousError
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
DIAL_THREADS = 16  # dials of set-up in flight at once (each waits mostly on its peer's handshake)
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


Link = tuple[socket.socket, Sealer]
Deliver = Callable[[int, socket.socket, Sealer], object]


def _connect(address: str, rank: int, peer: int, secret: bytes, scope: bytes, level: int,
             deadline: float, listening: bool = False) -> Link:
    """Dial rank ``peer`` at ``address`` and authenticate, retrying while it does not listen yet
    or is too busy to take the connection. ``listening``: the peer listened already, so a
    refused connection means it is gone (``PeerLostError`` at once)."""
    host, port = address.rsplit(":", 1)
    pause = CONNECT_RETRY_INTERVAL
    while True:
        try:
            sock = socket.create_connection((host, int(port)), timeout=max(0.1, deadline - time.monotonic()))
        except OSError as exc:
            if out_of_descriptors(exc):
                raise RendezvousError(f"rank {rank}: cannot connect to peer at {address}: "
                                      f"{describe_error(exc)}") from None
            if listening and isinstance(exc, ConnectionRefusedError):
                raise PeerLostError(peer, f"it refused a connection at {address} (it died or left "
                                          "the job)") from None
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
                 scope: bytes = b"", level: int | None = None) -> dict[int, Link]:
    """Connect this rank to every other at once (the full mesh), finding the others' addresses
    in ``store`` under ``tcp/addr/<rank>``; return ``{peer global rank: (socket, sealer)}``.

    ``scope`` names what the mesh is for; every rank must pass the same. ``level`` is this rank's
    link protection (default: ``sealing.configured_level()``).

    Raises:
        RendezvousError: a peer could not be reached or did not arrive within ``timeout``, or
            this process ran out of descriptors (the message names the limit).
        AuthenticationError: a link failed the job-secret handshake (a relay in a peer's place,
            or another job's secret).
        ValueError: ``TENSORCOMM_LINK_PROTECTION`` is invalid.
    """
    mesh = Mesh(rank, size, secret, host, scope, level)
    try:
        store.set(f"tcp/addr/{rank}", mesh.address.encode())
        # Only the lower ranks' addresses are dialled (and the store read) here.
        addresses = [store.get(f"tcp/addr/{peer}", timeout=timeout).decode() if peer < rank else ""
                     for peer in range(size)]
        return mesh.connect(addresses, [peer for peer in range(size) if peer != rank], timeout)
    finally:
        mesh.close()


class Mesh:
    """This rank's TCP listener and dialler for the links of one world.

    Args:
        rank, size: this rank and the number of ranks.
        secret: the job secret's key.
        host: the address to listen on (one the peers can reach).
        scope: what the links are for (the world's generation); every rank passes the same.
        level: this rank's link protection (default ``sealing.configured_level()``).

    Raises:
        ValueError: ``TENSORCOMM_LINK_PROTECTION`` is invalid.
    """

    def __init__(self, rank: int, size: int, secret: bytes, host: str, scope: bytes = b"",
                 level: int | None = None) -> None:
        self.rank, self.size = rank, size
        self._secret, self._scope = secret, scope
        self.level = configured_level() if level is None else level
        self._listener = socket.create_server((host, 0), backlog=min(max(size, 8), 4096))
        self.address = f"{host}:{self._listener.getsockname()[1]}"
        self._addresses: list[str] = []  # every rank's, once ``connect`` was given them
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._accepted: dict[int, Link] = {}  # links dialled in, not yet taken
        self._seen: set[int] = set()  # ranks that dialled in, ever
        self._deliver: Deliver | None = None  # where links dialled in go once set-up is over
        self._error: BaseException | None = None  # what set-up fails with
        self._closed = False
        self._gate = Gate(f"rank {rank} data listener", log)
        self._thread = threading.Thread(target=self._accept, daemon=True, name="tensorcomm-tcp-accept")
        self._thread.start()

    def connect(self, addresses: Sequence[str], peers: Iterable[int], timeout: float) -> dict[int, Link]:
        """Make the links to ``peers`` now: dial the lower ones (concurrently) at ``addresses``
        (every rank's, by rank), wait for the higher ones to dial in; return them by peer.

        Raises:
            RendezvousError: a peer could not be reached or did not dial in within ``timeout``,
                a connection claimed a rank twice, or this process ran out of descriptors.
            AuthenticationError: a link failed the handshake.
        """
        self._addresses = list(addresses)
        deadline = time.monotonic() + timeout
        peers = sorted(set(peers))
        lower = [peer for peer in peers if peer < self.rank]
        links: dict[int, Link] = {}
        failure: BaseException | None = None
        try:
            if lower:
                with ThreadPoolExecutor(min(DIAL_THREADS, len(lower)), "tensorcomm-tcp-dial") as pool:
                    dials = {peer: pool.submit(_connect, self._addresses[peer], self.rank, peer, self._secret,
                                               self._scope, self.level, deadline) for peer in lower}
                    for peer, dial in dials.items():
                        try:
                            links[peer] = dial.result()
                        except BaseException as exc:  # noqa: BLE001 - raised below, the others' links closed
                            failure = failure or exc
                if failure is not None:
                    raise failure
            links.update(self._take([peer for peer in peers if peer > self.rank], deadline, timeout))
        except BaseException:
            for sock, _ in links.values():
                sock.close()
            raise
        return links

    def dial(self, peer: int, timeout: float) -> Link:
        """Make the link to ``peer`` now (after set-up: it listens, so a refusal means it is gone).

        Raises:
            PeerLostError: ``peer`` refused the connection.
            RendezvousError: it could not be reached within ``timeout``.
            AuthenticationError: the link failed the handshake.
        """
        return _connect(self._addresses[peer], self.rank, peer, self._secret, self._scope, self.level,
                        time.monotonic() + timeout, listening=True)

    def settle(self, wait: float) -> None:
        """Wait up to ``wait`` seconds for the handshakes under way: a link a peer finished
        dialling is then with ``attach``'s taker."""
        self._gate.settle(wait)

    def attach(self, deliver: Deliver) -> None:
        """Hand every link dialled in from now on (and any taken by none so far) to ``deliver``."""
        with self._lock:
            self._deliver = deliver
            early, self._accepted = self._accepted, {}
        for peer, (sock, sealer) in early.items():
            deliver(peer, sock, sealer)

    def close(self, wait: float = 0.0) -> None:
        """Stop accepting; close the links dialled in that nobody took. Handshakes under way get
        up to ``wait`` seconds to end: their links still go to ``attach``'s taker (a transport
        that closes says goodbye on them), so a rank whose dial this one was checking does not
        see it closed without a word (and take this rank for dead)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._arrived.notify_all()
            left, self._accepted = list(self._accepted.values()), {}
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the acceptor's accept() (Linux)
        except OSError:
            pass
        self._thread.join(5.0)
        self._listener.close()
        self._gate.close()
        if wait > 0:
            self._gate.join(wait)
        for sock, _ in left:
            sock.close()

    def _take(self, higher: list[int], deadline: float, timeout: float) -> dict[int, Link]:
        """Wait until every rank in ``higher`` dialled in; take their links.

        Raises:
            RendezvousError: accepting failed, a connection claimed a rank twice, or ranks are
                missing at the deadline.
        """
        with self._arrived:
            while True:
                if self._error is not None:
                    raise self._error
                missing = [peer for peer in higher if peer not in self._accepted]
                remaining = deadline - time.monotonic()
                if not missing:
                    return {peer: self._accepted.pop(peer) for peer in higher}
                if remaining <= 0 or self._closed:
                    raise RendezvousError(f"rank {self.rank}: ranks {missing} did not connect within "
                                          f"{timeout:g} s")
                self._arrived.wait(remaining)

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self._listener.accept()
            except OSError as exc:
                if self._closed:
                    return
                if out_of_descriptors(exc):
                    self._out_of_descriptors(describe_error(exc))
                    time.sleep(0.1)
                    continue
                log.warning("rank %d: the data listener failed: %s", self.rank, exc)
                return
            if not self._gate.admit(sock, f"{addr[0]}:{addr[1]}", self._handshake) and self._gate.starved:
                self._out_of_descriptors(self._gate.starved)  # no descriptor to watch it with

    def _out_of_descriptors(self, why: str) -> None:
        """Fail set-up, naming the descriptor limit (after set-up: warn)."""
        with self._lock:
            setting_up = self._deliver is None
            if setting_up and self._error is None:
                self._error = RendezvousError(f"rank {self.rank}: cannot accept the other ranks' "
                                              f"connections: {why}")
                self._arrived.notify_all()
        if not setting_up:
            self._gate.warn(f"cannot accept a connection: {why}")

    def _handshake(self, sock: socket.socket, peer: str) -> None:
        try:
            _tune(sock)
            session = auth.handshake_server(sock, self._secret, HANDSHAKE_TIMEOUT, b"data",
                                            addresses=(self.address,), rank=self.rank, scope=self._scope,
                                            options=self.level)
            rank, sealer = session.peer_rank, Sealer.for_session(session, self.level)
        except (AuthenticationError, OSError) as exc:
            # A stranger or a broken client: drop it; the real ranks are not kept waiting.
            sock.close()
            log.warning("rank %d: refused a data connection from %s: %s", self.rank, peer, exc)
            return None
        with self._lock:
            deliver = self._deliver
            if self._closed and deliver is None:  # set-up is over, and nobody takes links
                sock.close()
                return None
            if not 0 <= rank < self.size or rank == self.rank or rank in self._seen:
                # Each rank dials this one at most once: a second claim is not a real rank's.
                sock.close()
                if deliver is None and self._error is None:
                    self._error = RendezvousError(f"rank {self.rank}: unexpected connection claiming "
                                                  f"rank {rank}")
                    self._arrived.notify_all()
                elif deliver is not None:
                    log.warning("rank %d: refused a second connection claiming rank %d", self.rank, rank)
                return None
            self._seen.add(rank)
            sock.settimeout(None)
            if deliver is None:
                self._accepted[rank] = (sock, sealer)
                self._arrived.notify_all()
                return None
        deliver(rank, sock, sealer)
        return None
