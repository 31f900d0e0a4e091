"""Build the full mesh: every pair of ranks gets one authenticated TCP connection.

Each rank listens on its own address and publishes it in the store; a rank connects to every
lower rank and accepts every higher one. Accepting runs in a thread beside the connects, so no
ordering of arrivals can deadlock. Every link passes the job-secret challenge (``purpose=b"data"``)
before the ranks are exchanged, so a stranger can neither join nor impersonate a rank.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time

from ...config import CONNECT_RETRY_INTERVAL, SOCKET_BUFFER_BYTES
from ...errors import AuthenticationError, RendezvousError
from ...rendezvous import auth
from ...rendezvous.store import Store

_RANK = struct.Struct("<I")
KEEPALIVE_IDLE_SECONDS = 5
KEEPALIVE_INTERVAL_SECONDS = 2
KEEPALIVE_PROBES = 3
# Linux lets TCP_USER_TIMEOUT override the keep-alive probe count, so it must not be longer
# than the keep-alive verdict (idle + interval x probes) or a vanished host is noticed late.
USER_TIMEOUT_MS = (KEEPALIVE_IDLE_SECONDS + KEEPALIVE_INTERVAL_SECONDS * KEEPALIVE_PROBES) * 1000
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


def _connect(address: str, rank: int, secret: bytes, deadline: float) -> socket.socket:
    host, port = address.rsplit(":", 1)
    while True:
        try:
            sock = socket.create_connection((host, int(port)), timeout=max(0.1, deadline - time.monotonic()))
            break
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise RendezvousError(f"could not connect to peer at {address}: {exc}") from None
            time.sleep(CONNECT_RETRY_INTERVAL)
    _tune(sock)
    auth.handshake_client(sock, secret, max(0.1, deadline - time.monotonic()), b"data")
    sock.sendall(_RANK.pack(rank))
    sock.settimeout(None)
    return sock


def connect_mesh(rank: int, size: int, store: Store, secret: bytes, host: str,
                 timeout: float) -> dict[int, socket.socket]:
    """Connect this rank to every other; return ``{peer global rank: socket}``.

    Raises:
        RendezvousError: a peer could not be reached or did not arrive within ``timeout``.
        AuthenticationError: a link failed the job-secret challenge.
    """
    deadline = time.monotonic() + timeout
    listener = socket.create_server((host, 0), backlog=max(size, 8))
    store.set(f"tcp/addr/{rank}", f"{host}:{listener.getsockname()[1]}".encode())
    accepted: dict[int, socket.socket] = {}
    failures: list[BaseException] = []
    acceptor = threading.Thread(target=_accept_higher, daemon=True, name="tensorcomm-tcp-accept",
                                args=(listener, rank, size, secret, deadline, accepted, failures))
    acceptor.start()
    sockets: dict[int, socket.socket] = {}
    try:
        for peer in range(rank):
            address = store.get(f"tcp/addr/{peer}", timeout=max(0.1, deadline - time.monotonic())).decode()
            sockets[peer] = _connect(address, rank, secret, deadline)
        acceptor.join(max(0.0, deadline - time.monotonic()) + 1.0)
        if failures:
            raise failures[0]
        missing = sorted(set(range(rank + 1, size)) - set(accepted))
        if missing:
            raise RendezvousError(f"rank {rank}: ranks {missing} did not connect within {timeout:g} s")
    except BaseException:
        for sock in [*sockets.values(), *accepted.values()]:
            sock.close()
        raise
    finally:
        listener.close()
    sockets.update(accepted)
    return sockets


def _accept_higher(listener: socket.socket, rank: int, size: int, secret: bytes, deadline: float,
                   accepted: dict[int, socket.socket], failures: list[BaseException]) -> None:
    expected = set(range(rank + 1, size))
    while expected - set(accepted):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        listener.settimeout(remaining)
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        try:
            _tune(sock)
            auth.handshake_server(sock, secret, max(0.1, deadline - time.monotonic()), b"data")
            (peer,) = _RANK.unpack(auth.recv_exact(sock, _RANK.size, max(0.1, deadline - time.monotonic())))
        except (AuthenticationError, OSError) as exc:
            # A stranger or a broken client: drop it and keep waiting for the real ranks.
            sock.close()
            log.warning("refused a data connection: %s", exc)
            continue
        if peer not in expected or peer in accepted:
            sock.close()
            failures.append(RendezvousError(f"rank {rank}: unexpected connection claiming rank {peer}"))
            return
        sock.settimeout(None)
        accepted[peer] = sock
