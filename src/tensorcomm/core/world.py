"""The single runtime object made by ``init()`` and ended by ``destroy()``.

The world owns the rendezvous store, the transport between all ranks, the registry of named
groups and the job's timeout. Nothing else in tensorcomm keeps global state.

Every group whose members all share this host (same host identity, see ``TENSORCOMM_HOST_ID``)
gets a shared-memory domain, set up by its members when the group is made, unless a member runs
with ``TENSORCOMM_TRANSPORT=tcp`` or is not on x86-64; if setting it up fails on any member
(e.g. members in different network namespaces), the whole group falls back to TCP.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import socket
import threading
import time
from typing import Sequence

from .. import config
from ..signature import Signature
from ..errors import CommTimeoutError, GroupAbortedError, RendezvousError
from ..rendezvous.init_method import Rendezvous, rendezvous
from ..rendezvous.store import Store
from ..transports.base import Transport
from ..transports.shm import slots as shm_slots
from ..transports.shm.domain import ShmDomain, ShmUnavailable, open_domain
from ..transports.tcp.mesh import connect_mesh
from ..transports.tcp.transport import TcpTransport
from .group import Group

log = logging.getLogger("tensorcomm.shm")

WORLD_NAME = "world"
MAX_GROUP_ID = (1 << 15) - 1

_current: "World | None" = None
_current_lock = threading.Lock()


class World:
    """Everything one initialised process knows about its job."""

    def __init__(self, rdzv: Rendezvous, timeout: float, transport: str = "auto") -> None:
        self.rendezvous = rdzv
        self.rank = rdzv.rank
        self.size = rdzv.world_size
        self.local_rank = rdzv.local_rank
        self.timeout = timeout
        store = rdzv.store
        # Each rank says where it runs and whether it may use shared memory (a group uses it
        # only if all its members may).
        allowed = "1" if transport != "tcp" and shm_slots.SUPPORTED else "0"
        store.set(f"join/{self.rank}", f"{allowed}{rdzv.host_id}".encode())
        joined = [entry.decode() for entry in _await_everyone(store, self.rank, self.size, timeout)]
        self._hosts = tuple(entry[1:] for entry in joined)
        self._shm_allowed = tuple(entry[0] == "1" for entry in joined)
        sockets = connect_mesh(self.rank, self.size, store, rdzv.secret, _bind_address(store), timeout)
        self.transport: Transport = TcpTransport(self.rank, self.size, sockets, send_timeout=timeout)
        self._groups: list[Group] = []
        try:
            self.world_group = Group(WORLD_NAME, range(self.size), 0, self,
                                     self._shared_memory(tuple(range(self.size)), 0, WORLD_NAME))
        except BaseException:
            self.transport.close()
            raise
        self._named: dict[str, Group] = {WORLD_NAME: self.world_group}
        self._groups.append(self.world_group)
        self._lock = threading.Lock()

    def hosts_of(self, ranks: Sequence[int]) -> tuple[str, ...]:
        """Host identity of each of ``ranks`` (equal strings share a host)."""
        return tuple(self._hosts[r] for r in ranks)

    def new_group(self, ranks: Sequence[int], name: str | None = None) -> Group:
        """Make a group of ``ranks`` (validated global ranks, in group-rank order).

        Members agree on the group's id through the store, so either every process or only the
        members may call this; non-members get a Group whose ``is_member`` is False.
        """
        with self._lock:
            if name is not None and name in self._named:
                raise ValueError(f"group name {name!r} is already registered")
            occurrence = sum(1 for g in self._groups if g._ranks == tuple(ranks))
            label = name or f"group{len(self._groups)}"
            group_id, shm = -1, None
            if self.rank in ranks:
                group_id = self._agree_group_id(tuple(ranks), occurrence, name)
                shm = self._shared_memory(tuple(ranks), group_id, label)
            group = Group(label, ranks, group_id, self, shm)
            self._groups.append(group)
            if name is not None:
                self._named[name] = group
            return group

    def _agree_group_id(self, ranks: tuple[int, ...], occurrence: int, name: str | None) -> int:
        key = f"group/{','.join(map(str, ranks))}/{name or ''}/{occurrence}"
        store = self.rendezvous.store
        if self.rank == ranks[0]:
            group_id = store.add("group/next_id", 1)
            if group_id > MAX_GROUP_ID:
                raise ValueError(f"a job can create at most {MAX_GROUP_ID} groups")
            store.set(key, str(group_id).encode())
        return int(store.get(key, timeout=self.timeout))

    def _shared_memory(self, ranks: tuple[int, ...], group_id: int, name: str) -> ShmDomain | None:
        """Set up the shared-memory domain of a group this rank belongs to, if it can have one.

        Every member calls this together. A group gets a domain when it has two or more members,
        all on this host and all allowed shared memory; if setting up fails on any member, every
        member gets None (the group uses TCP) and the failing one logs why.
        """
        if len(ranks) < 2 or len(set(self.hosts_of(ranks))) != 1 \
                or not all(self._shm_allowed[r] for r in ranks):
            return None
        store = self.rendezvous.store
        prefix = f"shm/{group_id}/"

        def publish(address: str) -> None:
            store.set(prefix + "address", address.encode())

        def lookup(seconds: float) -> str | None:
            if store.check([prefix + "address"]):
                return store.get(prefix + "address").decode()
            time.sleep(min(seconds, 0.005))
            return None

        def failed() -> str | None:
            return store.get(prefix + "failed").decode() if store.check([prefix + "failed"]) else None

        rank = ranks.index(self.rank)
        domain = None
        try:
            domain = open_domain(rank, ranks, name, self.rendezvous.secret, publish, lookup, failed,
                                 self.timeout, _describe)
        except ShmUnavailable as exc:
            log.warning("group %r: rank %d cannot use shared memory (%s); the group uses TCP",
                        name, self.rank, exc)
            store.set(prefix + "failed", f"rank {self.rank}: {exc}".encode())
        store.set(prefix + f"ready/{rank}", b"1" if domain is not None else b"0")
        keys = [prefix + f"ready/{q}" for q in range(len(ranks))]
        store.wait(keys, timeout=self.timeout)
        if all(store.get(key) == b"1" for key in keys):
            return domain
        if domain is not None:
            domain.close()
        return None

    def named_group(self, name: str) -> Group:
        """The group registered under ``name``.

        Raises:
            ValueError: no group has that name.
        """
        try:
            return self._named[name]
        except KeyError:
            raise ValueError(f"group: no group is named {name!r}; known: {sorted(self._named)}") from None

    def close(self) -> None:
        """Fail pending calls, close the transport and the store."""
        error = GroupAbortedError("the process group was destroyed")
        for group in self._groups:
            group._stop(error)
        self.transport.close()
        self.rendezvous.close()


def _describe(codes: Sequence[int]) -> str:
    return Signature(*codes).describe()


def _await_everyone(store: Store, rank: int, size: int, timeout: float) -> list[bytes]:
    """Every rank's ``join/`` entry, in rank order.

    Raises:
        RendezvousError: some ranks did not join within ``timeout``; names who did and who not.
    """
    keys = [f"join/{r}" for r in range(size)]
    try:
        store.wait(keys, timeout=timeout)
    except CommTimeoutError:
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
        arrived = sorted(set(range(size)) - set(missing))
        raise RendezvousError(f"rank {rank}: ranks {missing} of {size} did not join within "
                              f"{timeout:g} s (arrived: {arrived})") from None
    return [store.get(key, timeout=timeout) for key in keys]


def _bind_address(store: object) -> str:
    """Address peers can reach this rank at: loopback when the store is on loopback."""
    host = getattr(store, "host", "127.0.0.1")
    try:
        if ipaddress.ip_address(socket.gethostbyname(host)).is_loopback:
            return "127.0.0.1"
    except (OSError, ValueError):
        pass
    # The interface that routes to the store; a UDP connect sends no packet.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, getattr(store, "port", 1)))
        return probe.getsockname()[0]


def _seconds(timeout: float | datetime.timedelta | None, default: float) -> float:
    if timeout is None:
        return default
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout: expected seconds (a number) or a datetime.timedelta, "
                        f"got {type(timeout).__name__}")
    if timeout <= 0:
        raise ValueError(f"timeout: must be positive, got {timeout}")
    return float(timeout)


def init(init_method: str | None = None, rank: int | None = None, world_size: int | None = None,
         timeout: float | datetime.timedelta | None = None) -> None:
    """Join the job: rendezvous, connect to every rank, create the world group.

    Args:
        init_method: ``env://`` (default: read the launcher's environment), ``tcp://host:port``
            or ``file:///path``.
        rank: this process's global rank (default: from the environment).
        world_size: number of ranks (default: from the environment).
        timeout: seconds (or a ``timedelta``) that bounds every blocking call, set-up included.

    Raises:
        RuntimeError: already initialised.
        RendezvousError: the job could not assemble within the timeout.
        AuthenticationError: a connection failed the job-secret challenge.
    """
    global _current
    with _current_lock:
        if _current is not None:
            raise RuntimeError("tensorcomm is already initialized; call destroy() first")
        from ..rendezvous.discovery import discover

        info = discover()
        seconds = _seconds(timeout, info.timeout or config.DEFAULT_TIMEOUT)
        rdzv = rendezvous(init_method, rank, world_size, seconds)
        try:
            _current = World(rdzv, seconds, info.transport)
        except BaseException:
            rdzv.close()
            raise


def destroy() -> None:
    """Leave the job: fail pending calls, close every connection. A no-op if not initialised."""
    global _current
    with _current_lock:
        world, _current = _current, None
    if world is not None:
        world.close()


def is_initialized() -> bool:
    """Whether ``init()`` has been called and ``destroy()`` not yet."""
    return _current is not None


def current_world() -> World:
    """The current world.

    Raises:
        RuntimeError: ``init()`` has not been called.
    """
    world = _current
    if world is None:
        raise RuntimeError("tensorcomm is not initialized: call tensorcomm.init() first")
    return world
