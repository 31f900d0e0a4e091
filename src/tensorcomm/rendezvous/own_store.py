"""tensorcomm's own store, for ranks that meet on a store tensorcomm does not own (torch's).

Owns :func:`own_store` and the announcement of the own store's address. torch's TCPStore lets
anyone who can connect read, write and list its keys, so nothing tensorcomm reads there may
steer it: rank 0 serves a :class:`TCPStoreServer` of its own (every client proves the job
secret), and the foreign store holds only its address with a MAC,
``HMAC(secret, "tensorcomm own store" 0 key 0 generation 0 store port 0 address)``, where ``key``
is the full key name (the foreign store's namespace included, e.g. torchrun's attempt) and
``store port`` the foreign store's: namespaces repeat from job to job (every torchrun job's first
attempt is ``tensorcomm/attempt_0``) but jobs running at once have different ports, so an
announcement copied from another job with the same secret is refused. A rank that finds a
MAC it cannot verify says so in the foreign store (``own_store/refused``): every rank raises
AuthenticationError at once rather than waiting out the timeout. Every other rendezvous key
(joins, link addresses, shared-memory addresses and failures, group ids) lives in the own store.

A stranger with access to the foreign store can therefore stop a job from starting (alter the
announcement, or claim a refusal), with an error that says so, and nothing more. Imports
``tcp_store``, ``store``, ``config`` and ``errors`` only.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import socket
import time

from tensorcomm.errors import AuthenticationError, CommTimeoutError, RendezvousError
from tensorcomm.rendezvous.store import PrefixStore, Store
from tensorcomm.rendezvous.tcp_store import TCPStore, TCPStoreServer

ADDRESS_KEY = "own_store/address"  # in the foreign store: "host:port\nmac" (hex)
REFUSED_KEY = "own_store/refused"  # in the foreign store: why a rank refused the address
ARRIVED_KEY = "own_store/arrived"  # in the own store: ranks connected so far
READY_KEY = "own_store/ready"  # in the own store: set by the last rank to connect
PURPOSE = b"tensorcomm own store"
POLL = 0.05  # seconds between looks at the foreign store for a refusal


def own_store(scheme: str, foreign: Store, key_prefix: str, generation: int, rank: int, world_size: int,
              secret: bytes, timeout: float) -> tuple[TCPStore, TCPStoreServer | None]:
    """Meet in tensorcomm's own store, announced (authenticated) in ``foreign``.

    Rank 0 serves it on the interface that reaches the foreign store's host and announces it;
    the others verify the announcement and connect. Returns once every rank has connected, so
    a refusal anywhere is an error everywhere.

    Args:
        scheme: names the rendezvous in error messages.
        foreign: the (scoped) store tensorcomm does not own; must have ``host``/``port`` or be
            a namespace of one that has.
        key_prefix: the full name of ``foreign``'s namespace in its underlying store (bound
            into the MAC, so an announcement cannot be replayed in another namespace).
        generation, rank, world_size, secret, timeout: this world's.

    Returns:
        A client of the own store, and the server when this is rank 0 (close it last).

    Raises:
        AuthenticationError: the announcement was tampered with (here or on another rank).
        RendezvousError: the own store cannot be served or reached, or not every rank
            connected within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    full_key = f"{key_prefix}/{ADDRESS_KEY}"
    foreign_port = address_of(foreign)[1]
    server = None
    try:
        if rank == 0:
            server = TCPStoreServer(reachable_address(address_of(foreign)[0], foreign_port), 0, secret)
            address = f"{_literal(server.host)}:{server.port}"
            mac = _mac(secret, full_key, generation, foreign_port, address)
            foreign.set(ADDRESS_KEY, f"{address}\n{mac}".encode())
            client = TCPStore(server.host, server.port, secret, timeout)
        else:
            host, port = _verified(scheme, foreign, full_key, generation, foreign_port, rank, secret,
                                   deadline)
            try:
                client = TCPStore(host, port, secret, max(deadline - time.monotonic(), 0.01))
            except (AuthenticationError, RendezvousError) as exc:
                refuse(foreign, f"rank {rank} cannot use tensorcomm's own store at {host}:{port}: {exc}",
                       tampered=isinstance(exc, AuthenticationError))
                raise
            client.timeout = timeout  # connecting had what was left; later requests get the whole
        try:
            _all_arrived(scheme, client, foreign, rank, world_size, deadline, timeout)
        except BaseException:
            client.close()
            raise
    except BaseException:
        if server is not None:
            server.close()
        raise
    return client, server


def _verified(scheme: str, foreign: Store, full_key: str, generation: int, foreign_port: int, rank: int,
              secret: bytes, deadline: float) -> tuple[str, int]:
    """The own store's address as rank 0 announced it; refuse (for everyone) one it did not."""
    try:
        announced = foreign.get(ADDRESS_KEY, max(deadline - time.monotonic(), 0.0))
    except CommTimeoutError:
        raise RendezvousError(f"{scheme}: rank 0 did not announce tensorcomm's own store under "
                              f"{full_key!r} in time (is rank 0 running?)") from None
    address, _, mac = announced.decode("utf-8", "replace").partition("\n")
    host, _, port = address.rpartition(":")
    expected = _mac(secret, full_key, generation, foreign_port, address)
    if not (hmac.compare_digest(mac.encode(), expected.encode()) and host and port.isdigit()
            and 0 < int(port) < 65536):
        why = (f"rank {rank} refused the announcement of tensorcomm's own store under {full_key!r}: "
               f"it was tampered with (its MAC does not match this rank's job secret: someone else "
               f"can write to this store, unless this rank's secret differs from rank 0's), and the "
               f"job does not start")
        refuse(foreign, why, tampered=True)
        raise AuthenticationError(f"{scheme}: {why}")
    return host.strip("[]"), int(port)


def refuse(foreign: Store, why: str, tampered: bool) -> None:
    """Tell every rank (waiting in :func:`own_store`) that this one cannot start, and why."""
    foreign.set(REFUSED_KEY, f"{'tampered' if tampered else 'refused'}\n{why}".encode())


def _all_arrived(scheme: str, client: TCPStore, foreign: Store, rank: int, world_size: int,
                 deadline: float, timeout: float) -> None:
    """Wait until every rank is in the own store, watching the foreign one for a refusal."""
    if client.add(ARRIVED_KEY, 1) == world_size:
        client.set(READY_KEY, b"1")
    while True:
        if foreign.check([REFUSED_KEY]):
            kind, _, why = foreign.get(REFUSED_KEY).decode("utf-8", "replace")[:400].partition("\n")
            error = AuthenticationError if kind == "tampered" else RendezvousError
            raise error(f"{scheme}: rank {rank}: the job does not start: the store (which others may "
                        f"write to) says another rank refused: {why!r}")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            arrived = client.get(ARRIVED_KEY) if client.check([ARRIVED_KEY]) else b"0"
            raise RendezvousError(f"{scheme}: rank {rank}: only {arrived.decode()} of {world_size} ranks "
                                  f"reached tensorcomm's own store within {timeout:g} s")
        try:
            client.wait([READY_KEY], min(POLL, remaining))
            return
        except CommTimeoutError:
            pass


def address_of(store: Store) -> tuple[str, int]:
    """The ``host``/``port`` of ``store``, or of the store a namespace (``PrefixStore``) is in;
    loopback when it has none."""
    while isinstance(store, PrefixStore):
        store = store.store
    return getattr(store, "host", "127.0.0.1"), getattr(store, "port", 1)


def reachable_address(host: str, port: int) -> str:
    """The local address peers reach this rank at: loopback when ``host`` is, else the
    interface that routes to ``host:port``."""
    try:
        if ipaddress.ip_address(socket.gethostbyname(host)).is_loopback:
            return "127.0.0.1"
    except (OSError, ValueError):
        pass
    # A UDP connect sends no packet.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        return str(probe.getsockname()[0])


def _literal(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _mac(secret: bytes, full_key: str, generation: int, foreign_port: int, address: str) -> str:
    message = b"\0".join([PURPOSE, full_key.encode(), str(generation).encode(), str(foreign_port).encode(),
                          address.encode()])
    return hmac.new(secret, message, hashlib.sha256).hexdigest()
