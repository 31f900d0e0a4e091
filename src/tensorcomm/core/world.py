"""The single runtime object ``init()`` makes and ``destroy()`` ends (``core.lifecycle``).

The world owns the rendezvous store, the transport between all ranks, the registry of named
groups and the job's timeout. Every world keeps its keys under ``tensorcomm/<generation>/`` in
the store, the generation counted by the store itself (the ``tensorcomm/arrivals`` counter: the
n-th ``init`` of every rank gets generation n - 1), so a new world never reads an old one's
addresses.

Every group whose members all share this host (same host identity, see ``TENSORCOMM_HOST_ID``)
gets a shared-memory domain, set up by its members when the group is made, unless a member runs
with ``TENSORCOMM_TRANSPORT=tcp`` or is not on x86-64; if setting it up fails on any member
(e.g. members in different network namespaces), the whole group falls back to TCP.

What carries the other groups' messages is the world's *backend*: tensorcomm's TCP links, or MPI
(``backend="mpi"``, ``transports/mpi``), which under mpirun also provides the rendezvous.

Joining costs one store write and one store read per rank: each rank's ``join/`` entry says
where it runs, whether it may use shared memory, its TCP address and its process. Ranks that
share a host, may all use shared memory and see each other's processes (*partners*) get no TCP
link at init: their groups run on shared memory, and a link is made when something first needs
one (``transports/tcp/links.Links.open``); every other pair is linked at init, concurrently. A
partner's death is seen from its process (``transports/liveness.py``), a linked peer's from its
link (``lost_peers``). Joining waits up to the join timeout (``TENSORCOMM_JOIN_TIMEOUT``), not the
collective timeout: ranks of a large job on a busy host may start minutes apart.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from .. import config
from ..algorithms import select
from ..algorithms.base import Hierarchy
from ..errors import CommTimeoutError, GroupAbortedError, PeerLostError, RendezvousError
from ..rendezvous.init_method import Rendezvous
from ..rendezvous.own_store import address_of, reachable_address
from ..rendezvous.store import PrefixStore, Store
from ..signature import Signature
from ..transports.liveness import ProcessWatch, start_time
from ..transports.shm import slots as shm_slots
from ..transports.shm.arena import OutOfDescriptors
from ..transports.shm.domain import ShmDomain, ShmUnavailable, open_domain
from ..transports.tcp.mesh import Mesh
from ..transports.tcp.transport import TcpTransport
from .engine import Engine
from .group import Group, inside

if TYPE_CHECKING:
    from ..transports.mpi.transport import MpiTransport

log = logging.getLogger("tensorcomm.shm")

WORLD_NAME = "world"
MAX_GROUP_ID = (1 << 15) - 1
ARRIVALS_KEY = "tensorcomm/arrivals"  # counts inits, across generations
DESTROY_LINGER = 2.0  # seconds destroy() waits for the peers' goodbyes (see TcpTransport.close)
# Seconds a set-up waits on the store between liveness checks. The store answers a wait as soon as
# its keys are set, so the longest pause bounds only how late a death is seen; shorter pauses
# cost requests: 63 ranks polling every 20 ms kept rank 0's store (and rank 0) busy at 64 ranks.
POLL_FIRST, POLL_MAX = 0.001, 0.25



class World:
    """Everything one initialised process knows about its job."""

    def __init__(self, rdzv: Rendezvous, timeout: float, transport: str = "auto",
                 backend: str = "tensorcomm", hierarchy: bool = True,
                 algorithms: Sequence[tuple[str, str]] = (), keep_going: bool = False,
                 cma: bool = True, join_timeout: float | None = None, learn: bool = True) -> None:
        self.hierarchy = hierarchy
        self.keep_going = keep_going  # failed calls leave in-place arrays untouched or complete
        self.cma = cma  # ranks on this host may read each other's memory (TENSORCOMM_CMA)
        self.learn = learn  # shared-memory groups learn which algorithms run (TENSORCOMM_LEARN)
        self.algorithms = _checked_algorithms(algorithms)
        self.rendezvous = rdzv
        self.rank = rdzv.rank
        self.size = rdzv.world_size
        self.local_rank = rdzv.local_rank
        self.timeout = timeout
        join_timeout = timeout if join_timeout is None else join_timeout
        self.generation = (rdzv.store.add(ARRIVALS_KEY, 1) - 1) // self.size
        self.store = store = PrefixStore(f"tensorcomm/{self.generation}", rdzv.store)
        # Listen first: the join entry carries the address (where the store's host is reached).
        mesh = None if backend == "mpi" else Mesh(
            self.rank, self.size, rdzv.secret, reachable_address(*address_of(rdzv.store)),
            f"world generation {self.generation}".encode())
        try:
            # Each rank says where it runs, whether it may use shared memory (a group uses it only
            # if all its members may), where it listens and which process it is.
            allowed = "1" if transport != "tcp" and shm_slots.SUPPORTED else "0"
            started = start_time(os.getpid())
            me = _Joined(allowed == "1", _process_space() if started else "", os.getpid(), started or 0,
                         "" if mesh is None else mesh.address, rdzv.host_id)
            store.set(f"join/{self.rank}", me.encode())
            joined = [_Joined.decode(entry)
                      for entry in _await_everyone(store, self.rank, self.size, join_timeout)]
            self._hosts = tuple(j.host for j in joined)
            self._shm_allowed = tuple(j.shm for j in joined)
            partners = [r for r, j in enumerate(joined) if r != self.rank and me.partners(j)]
            watch = ProcessWatch({r: joined[r].pid for r in partners},
                                 {r: joined[r].started for r in partners})
            self.transport = _connect(backend, rdzv, mesh, [j.address for j in joined], watch,
                                      timeout, join_timeout)
        except BaseException:
            if mesh is not None:
                mesh.close()
            raise
        self._groups: list[Group] = []
        self._made: Counter[tuple[int, ...]] = Counter()  # groups made per member list, ever
        try:
            everyone = tuple(range(self.size))
            self.world_group = Group(WORLD_NAME, everyone, 0, self,
                                     self._shared_memory(everyone, 0, WORLD_NAME),
                                     *self._hierarchy(everyone, 0, WORLD_NAME))
        except BaseException:
            self.transport.close()
            raise
        self._named: dict[str, Group] = {WORLD_NAME: self.world_group}
        self._groups.append(self.world_group)
        self._lock = threading.Lock()
        self.forked: RuntimeError | None = None  # set in a child forked from this process

    def lost_peers(self, ranks: frozenset[int]) -> frozenset[int]:
        """Which of ``ranks`` are lost: their link closed or (partners, who may have no link)
        their process ended (``TcpTransport.lost_peers``)."""
        return self.transport.lost_peers() & ranks

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
            occurrence = self._made[tuple(ranks)]
            self._made[tuple(ranks)] += 1
            label = name or f"group of ranks {list(ranks)}"  # a non-member's
            group_id, shm, hier = -1, None, None
            parts: list[Group] = []
            if self.rank in ranks:
                group_id = self._agree_group_id(tuple(ranks), occurrence, name)
                label = name or f"group{group_id}"  # the id, unlike a count, is the same on every member
                shm = self._shared_memory(tuple(ranks), group_id, label)
                hier, parts = self._hierarchy(tuple(ranks), group_id, label)
            group = Group(label, ranks, group_id, self, shm, hier, parts)
            self._groups.append(group)
            if name is not None:
                self._named[name] = group
            return group

    def _agree_group_id(self, ranks: tuple[int, ...], occurrence: int, name: str | None) -> int:
        key = f"group/{','.join(map(str, ranks))}/{name or ''}/{occurrence}"
        store = self.store
        if self.rank == ranks[0]:
            store.set(key, str(self.take_group_id()).encode())
        else:
            self._await_members({key: ranks[0]}, name or f"of ranks {list(ranks)}", "its id")
        return int(store.get(key))

    def _await_members(self, keys: dict[str, int], label: str, what: str) -> None:
        """Wait until the store holds ``keys``, each set by the global rank it maps to, while
        group ``label`` is made, as a shrink's agreement waits: a member whose link closes
        (dead, or gone) is named at once, not at the timeout.

        Raises:
            PeerLostError: a member the keys wait for is lost (the lowest such rank).
            CommTimeoutError: the world's timeout passed; names the ranks still missing.
        """
        members = frozenset(keys.values())
        deadline = time.monotonic() + self.timeout
        pause = POLL_FIRST
        while True:
            try:
                self.store.wait(list(keys), timeout=pause)
                return
            except CommTimeoutError:
                pass
            gone = self.lost_peers(members)
            late = time.monotonic() >= deadline
            if not gone and not late:
                pause = min(2 * pause, POLL_MAX)
                continue
            # A member that posted its key and then left is not what this waits for.
            missing = sorted({rank for key, rank in keys.items() if not self.store.check([key])})
            dead = [rank for rank in missing if rank in gone]
            if dead:
                raise PeerLostError(dead[0], f"its connection closed while group {label!r} was being "
                                             f"made (setting up {what}): it died or left the job")
            if not missing:
                return
            if late:
                raise CommTimeoutError(f"group {label!r}: ranks {missing} did not finish setting up "
                                       f"{what} within {self.timeout:g} s (alive as far as this rank "
                                       f"can tell: stopped, hung, or not calling this)")

    def take_group_id(self) -> int:
        """A group id nobody in this world has had (counted in the store).

        Raises:
            ValueError: the world made ``MAX_GROUP_ID`` groups already.
        """
        group_id = self.store.add("group/next_id", 1)
        if group_id > MAX_GROUP_ID:
            raise ValueError(f"a job can create at most {MAX_GROUP_ID} groups")
        return group_id

    def adopt(self, ranks: tuple[int, ...], group_id: int, label: str, shm: ShmDomain | None) -> Group:
        """Make and register the group a shrink agreed on (``core/elastic.py``): members, id and
        shared-memory domain are settled; a group that spans hosts gets its sub-teams here."""
        if shm is not None:
            shm.settle(self.cma, self.learn, self.timeout)
        group = Group(label, ranks, group_id, self, shm, *self._hierarchy(ranks, group_id, label))
        with self._lock:
            self._groups.append(group)
        return group

    def _hierarchy(self, ranks: tuple[int, ...], group_id: int,
                   label: str) -> tuple[Hierarchy | None, list[Group]]:
        """The host and cross sub-teams of a group that spans hosts (``algorithms/hier.py``),
        made by every member together; ``(None, [])`` (the group runs flat) when it is on one
        host, hierarchy is off (``TENSORCOMM_HIERARCHY``), hosts hold different numbers of
        members or one each, or a host team could not get shared memory on any member.
        """
        hosts = self.hosts_of(ranks)
        order = list(dict.fromkeys(hosts))
        members = {host: [r for r, where in zip(ranks, hosts, strict=True) if where == host]
                   for host in order}
        per_host = {len(m) for m in members.values()}
        if not self.hierarchy or len(order) < 2 or len(per_host) != 1 or per_host == {1}:
            return None, []
        mine = members[self._hosts[self.rank]]
        local = mine.index(self.rank)
        host = self._part(tuple(mine), f"{label}.host", f"{group_id}.host", ranks)
        cross = self._part(tuple(members[h][local] for h in order), f"{label}.cross", f"{group_id}.cross",
                           ranks)
        # All members must agree: some running hierarchical calls and others flat ones would hang.
        prefix = f"hier/{group_id}/"
        self.store.set(prefix + str(self.rank), b"1" if inside(host).shm is not None else b"0")
        keys = {prefix + str(r): r for r in ranks}
        try:
            self._await_members(keys, label, "its host and cross-host parts")
        except BaseException as exc:
            for part in (host, cross):
                inside(part).stop(GroupAbortedError(f"group {label!r} was not made: {exc}"))
            raise
        if not all(value == b"1" for value in self.store.multi_get(list(keys))):
            for part in (host, cross):
                inside(part).stop(GroupAbortedError(f"group {label!r} runs flat"))
            return None, []
        grid = [order.index(where) * len(mine) + members[where].index(r)
                for r, where in zip(ranks, hosts, strict=True)]
        return Hierarchy(inside(host).team(), inside(cross).team(), grid, select.pick), [host, cross]

    def _part(self, ranks: tuple[int, ...], label: str, key: str, whole: tuple[int, ...]) -> Group:
        """An internal group of the hierarchical group of ``whole`` (not registered, used by its
        calls only)."""
        group_id = self._agree_group_id(ranks, 0, key)
        return Group(label, ranks, group_id, self, self._shared_memory(ranks, group_id, label),
                     whole=whole)

    def _shared_memory(self, ranks: tuple[int, ...], group_id: int, name: str) -> ShmDomain | None:
        """Set up the shared-memory domain of a group this rank belongs to, if it can have one.

        Every member calls this together. A group gets a domain when it has two or more members,
        all on this host and all allowed shared memory; if setting up fails on any member, every
        member gets None (the group uses TCP) and the failing one logs why.

        Raises:
            RendezvousError: a member ran out of file descriptors (on every member, naming the
                descriptor limit and how to raise it).
            PeerLostError: a member was lost meanwhile (named on every member).
        """
        if not self._can_share_memory(ranks):
            return None
        domain = self.open_shared_memory(ranks, group_id, name)
        store = self.store
        prefix = f"shm/{group_id}/"
        rank = ranks.index(self.rank)
        store.set(prefix + f"ready/{rank}", b"1" if domain is not None else b"0")
        keys = {prefix + f"ready/{q}": r for q, r in enumerate(ranks)}
        try:
            self._await_members(keys, name, "its shared memory")
            if store.check([prefix + "fatal"]):
                why = store.get(prefix + "fatal").decode()
                raise RendezvousError(f"group {name!r} cannot be made: {why}")
            if all(value == b"1" for value in store.multi_get(list(keys))):  # one request, not n
                assert domain is not None
                domain.settle(self.cma, self.learn, self.timeout)
                return domain
        except BaseException:
            if domain is not None:
                domain.close()
            raise
        if domain is not None:
            domain.close()
        return None

    def _can_share_memory(self, ranks: tuple[int, ...]) -> bool:
        return len(ranks) >= 2 and len(set(self.hosts_of(ranks))) == 1 \
            and all(self._shm_allowed[r] for r in ranks)

    def open_shared_memory(self, ranks: tuple[int, ...], group_id: int, name: str,
                           abandon: Callable[[], str | None] | None = None,
                           timeout: float | None = None) -> ShmDomain | None:
        """This member's handle on a new group's shared-memory domain, or None: the group cannot
        have one, or setting it up failed (here or, as far as this member saw, elsewhere).

        Every member calls this together; members may end up differently, so they must agree
        afterwards and all drop their domains unless all have one (``_shared_memory``, or the
        acknowledgements of ``core/elastic.py``). ``abandon()``, polled while waiting for the
        others, says why to give up (or None; by default: a member was lost); ``timeout``
        defaults to the world's. A member out of file descriptors says so under
        ``shm/<group id>/fatal`` before it gives up (``_shared_memory`` then fails the group).
        """
        if not self._can_share_memory(ranks):
            return None
        prefix = f"shm/{group_id}/"
        try:
            return open_domain(ranks.index(self.rank), ranks, name, self.rendezvous.secret,
                               *self.segment_exchange(prefix, ranks, abandon),
                               self.timeout if timeout is None else timeout, _describe)
        except ShmUnavailable as exc:
            log.warning("group %r: rank %d cannot use shared memory (%s)", name, self.rank, exc)
            if isinstance(exc, OutOfDescriptors):  # before "failed": whoever sees that sees this
                self.store.set(prefix + "fatal", f"rank {self.rank}: {exc}".encode())
            self.store.set(prefix + "failed", f"rank {self.rank}: {exc}".encode())
            return None

    def segment_exchange(self, prefix: str, ranks: Sequence[int],
                         abandon: Callable[[], str | None] | None = None) -> tuple[
            Callable[[str], None], Callable[[float], str | None], Callable[[], str | None]]:
        """How the members (global ``ranks``) of a new shared segment find its leader through the
        store, under ``prefix``: ``publish``, ``lookup`` and ``failed`` for ``arena.establish``.
        ``failed`` reads the ``failed`` key a member sets when it gives up, else asks
        ``abandon()``, by default whether a member was lost."""
        store = self.store

        def publish(address: str) -> None:
            store.set(prefix + "address", address.encode())

        def lookup(seconds: float) -> str | None:
            try:  # the store answers as soon as the leader publishes
                return store.get(prefix + "address", timeout=max(seconds, 0.001)).decode()
            except CommTimeoutError:
                return None

        def failed() -> str | None:
            if store.check([prefix + "failed"]):
                return store.get(prefix + "failed").decode()
            if abandon is not None:
                return abandon()
            gone = self.lost_peers(frozenset(ranks))
            return f"ranks {sorted(gone)} were lost" if gone else None

        return publish, lookup, failed

    def named_group(self, name: str) -> Group:
        """The group registered under ``name``.

        Raises:
            ValueError: no group has that name.
        """
        try:
            return self._named[name]
        except KeyError:
            raise ValueError(f"group: no group is named {name!r}; known: {sorted(self._named)}") from None

    def forget(self, group: Group) -> None:
        """Drop a destroyed group from the registry."""
        with self._lock:
            self._groups = [g for g in self._groups if g is not group]
            self._named = {name: g for name, g in self._named.items() if g is not group}

    def close(self) -> None:
        """Fail pending calls, close the transport and the store."""
        if self.forked is not None:  # the sockets and memory belong to the parent: leave them be
            return
        error = GroupAbortedError("the process group was destroyed")
        for group in self._groups:
            inside(group).stop(error)
        self.transport.close(linger=DESTROY_LINGER)
        self.rendezvous.close()

    def _inherited(self) -> None:
        """This process was forked from a rank: refuse every call on its copies of the groups."""
        self.forked = RuntimeError(
            f"this process was forked from rank {self.rank} after tensorcomm.init(); a forked "
            "child cannot use its parent's groups (it would answer peers in the parent's place): "
            "call tensorcomm.init() in the child, or start it with 'spawn' or 'forkserver'")
        for group in self._groups:  # new engines: the old ones' locks may be held by parent threads
            its = inside(group)
            its.engine = Engine.refusing(group.name, self.forked)
            for request in its.requests:  # its bound round holds the parent's shared memory
                request.drop()


def _connect(backend: str, rdzv: Rendezvous, mesh: Mesh | None, addresses: list[str], partners: ProcessWatch,
             timeout: float, join_timeout: float) -> TcpTransport | MpiTransport:
    """The transport between all ranks: tensorcomm's TCP links (made now to every rank but the
    ``partners``, whose processes it watches instead), or MPI's point-to-point."""
    if mesh is None:
        from ..transports.mpi.transport import MpiTransport

        return MpiTransport.open(rdzv.rank, rdzv.world_size, timeout)
    now = [peer for peer in range(rdzv.world_size) if peer != rdzv.rank and peer not in partners.keys]
    links = mesh.connect(addresses, now, join_timeout)
    return TcpTransport(rdzv.rank, rdzv.world_size, links, send_timeout=timeout, mesh=mesh, watch=partners)


def _checked_algorithms(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """``TENSORCOMM_ALGORITHMS`` as ``{collective: algorithm}``, each name checked."""
    for collective, name in pairs:
        try:
            known = select.names(collective)
        except ValueError as exc:
            raise ValueError(f"{config.ENV_ALGORITHMS}: {exc}") from None
        if name not in known:
            raise ValueError(f"{config.ENV_ALGORITHMS}: {collective} has no algorithm {name!r}; "
                             f"expected one of {', '.join(known)}")
    return dict(pairs)


def _describe(codes: Sequence[int]) -> str:
    return Signature(*codes).describe()


def _await_everyone(store: Store, rank: int, size: int, timeout: float) -> list[bytes]:
    """Every rank's ``join/`` entry, in rank order (one store request).

    Raises:
        RendezvousError: some ranks did not join within ``timeout``; names who did and who not.
    """
    keys = [f"join/{r}" for r in range(size)]
    try:
        return store.multi_get(keys, timeout=timeout)
    except CommTimeoutError:
        # Counted again (once per rank, on this error path only): who came late, just after the
        # deadline, is no reason to fail.
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
        if not missing:
            return store.multi_get(keys, timeout=timeout)
        arrived = sorted(set(range(size)) - set(missing))
        raise RendezvousError(f"rank {rank}: ranks {missing} of {size} did not join within "
                              f"{timeout:g} s (arrived: {arrived})") from None


def _process_space() -> str:
    """This machine's boot and this process's pid namespace ("" if unknown): a pid names the
    same process only to processes of the same space."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            return f"{boot.read().strip()}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


class _Joined(NamedTuple):
    """One rank's ``join/`` entry."""

    shm: bool  # it may use shared memory
    space: str  # ``_process_space()``
    pid: int
    started: int  # its process's start time (``liveness.start_time``)
    address: str  # where its TCP listener is ("": none, under the MPI backend)
    host: str  # its host identity

    def encode(self) -> bytes:
        return "\n".join((str(int(self.shm)), self.space, str(self.pid), str(self.started),
                          self.address, self.host)).encode()

    @classmethod
    def decode(cls, raw: bytes) -> _Joined:
        shm, space, pid, started, address, host = raw.decode().split("\n", 5)
        return cls(shm == "1", space, int(pid), int(started), address, host)

    def partners(self, other: _Joined) -> bool:
        """Whether this rank and ``other`` share a host, may both use shared memory and see
        each other's processes (then they need no TCP link at init)."""
        return self.shm and other.shm and self.host == other.host and self.space == other.space != ""
