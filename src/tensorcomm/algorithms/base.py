"""What an algorithm sees of the world: its group rank, the group size and tagged messaging.

Algorithms never import ``core``; the core builds one ``Ctx`` per collective call, from the
group's ``Team`` and the call shape's ``Plan``. Every message of a call is tagged with the group
id, the call's sequence number in its group and a ``step`` chosen by the algorithm, so two
collectives (or two groups) never mix.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, NamedTuple

import numpy as np

from .. import config
from ..errors import CollectiveMismatchError, CommError, CommTimeoutError
from ..signature import Signature
from ..transports.base import STEP_BITS, Request, Transport, collective_tag
from .kernels import Reduction

_new = object.__new__
_monotonic = time.monotonic


PROGRESS_PROBE_SECONDS = 1.0  # how long a stalled rank waits for peers to say where they are
# A wait this long asks the peers which call they are in (then twice as long, and so on): two
# ranks that both wait for the other (both think they are a gather's root, say) find out then.
STALL_PROBE_SECONDS = 2.0
ACK_STEP = (1 << STEP_BITS) - 1  # the step of acknowledgements (see ``Ctx.acknowledge``)
# A scratch buffer no call needed whole for this long is given back (Scratch): a shape that
# recurs less often pays for fresh pages once per recurrence (a 64 MiB TCP all_reduce took about
# 24 ms more: benchmarks/results/scratch_soak_ab.txt).
SCRATCH_IDLE = 30.0
_NOTHING = np.empty(0, dtype=np.uint8)
_BYTE = np.dtype(np.uint8)


Predicate = Callable[["Team", int], bool]
# ``prepare(team, plan, *args)``: an algorithm's per-shape state, from the plan's first call's
# arguments (the algorithm's own, after the ``Ctx``); see ``Row``.
Prepare = Callable[..., Any]
# ``bind(plan, *args)``: a persistent call's one round, bound to its arrays, or None; see ``Row``.
Bind = Callable[..., "OneRound | None"]


class OneRound(NamedTuple):
    """A persistent call that is one round of the shared-memory protocol, bound to the arrays it
    was made with (``Row.bind``); ``core.bound`` runs it. Per IN slot ``p``: the calls of
    ``put[p]`` write this member's contribution into its slot, the round starts (``Slots.start``
    with ``extent``), every peer's announced extent is compared with ``extents`` (member ``q``'s
    at ``extents[q]``; None: not compared), and the calls of ``take[p]`` read what this member
    receives. A peer's extent that differs calls ``verify(ctx)``, which raises the error the
    algorithm raises. ``finish``, when given, runs instead of ``take`` as ``finish(ctx, p)``:
    the algorithm's own rest of the call, which may go on with more rounds; ``whole(ctx, p)``,
    given with it, says (once every peer's first post is there) whether it will not. The slots' contents,
    extents and checks are exactly the algorithm's own for the plan, so that members running one
    and the other meet.
    """

    domain: Any
    put: tuple[tuple[Callable[[], object], ...], tuple[Callable[[], object], ...]]
    take: tuple[tuple[Callable[[], object], ...], tuple[Callable[[], object], ...]]
    extent: int | None = None
    extents: tuple[int, ...] | None = None
    verify: Callable[[Ctx], None] | None = None
    finish: Callable[[Ctx, int], None] | None = None
    whole: Callable[[Ctx, int], bool] | None = None


class Row(NamedTuple):
    """One candidate algorithm (``select.ROWS``): ``fn`` runs ``collective`` when
    ``predicate(team, nbytes)`` holds.

    ``prepare``, when given, makes what ``fn`` works out once per call shape (slot views,
    bounds, the reduction): ``make_plan`` calls it with the group's ``Team``, the new ``Plan``
    and the first call's arguments, and keeps its result in ``Plan.state``. It must read only the
    shape of those arguments (dtype, sizes, counts, op, root: what the plan's key holds), never
    their values.

    ``bind``, when given, makes a persistent call of the plan that is one round on shared memory
    (``OneRound``) from the plan and the request's arguments, or None where ``fn`` takes more
    than one round for them.
    """

    collective: str
    name: str
    predicate: Predicate
    fn: Callable[..., None]
    prepare: Prepare | None = None
    bind: Bind | None = None


class Hierarchy:
    """A group that spans hosts, as one member sees it: its sub-teams and where members sit.

    Attributes:
        host: this member's host-mates (the same number on every host), with their shared-memory
            domain.
        cross: the members with this member's local index, one per host, in host order.
        grid: for each group rank, ``host index * members per host + local index``.
        order: for each position ``local index * hosts + host index``, the group rank there (the
            order in which blocks travel between the sub-teams).
        pick: chooses the algorithm of each step on a sub-team (``select.pick``, which lists the
            hierarchical algorithms and so is handed in rather than imported by them).
    """

    __slots__ = ("host", "cross", "grid", "order", "pick", "_seqs")

    def __init__(self, host: Team, cross: Team, grid: Sequence[int],
                 pick: Callable[[str, Team, int], Row]) -> None:
        self.host, self.cross, self.grid, self.pick = host, cross, tuple(grid), pick
        per_host, hosts = len(host.ranks), len(cross.ranks)
        order = np.empty(len(self.grid), dtype=np.int64)
        for rank, cell in enumerate(self.grid):
            order[cell % per_host * hosts + cell // per_host] = rank
        self.order = order
        self._seqs = [0, 0]  # the next call's sequence number on host, cross

    def next_seq(self, team: Team) -> int:
        """The sequence number of the next call on ``team`` (host or cross): the sub-teams run
        only this group's calls, which every member makes in the same order."""
        which = 0 if team is self.host else 1
        seq = self._seqs[which]
        self._seqs[which] = seq + 1
        return seq


class Scratch:
    """Memory one group's calls reuse, one buffer per purpose; owned by the group's ``Team`` and
    freed with the group (``clear``).

    Fresh memory costs a page fault per 4 KiB page on first touch, which on a VM took longer than
    the copy itself: the transport algorithms take their working buffers here instead of
    ``np.empty``. The group's calls run one at a time, so each purpose's buffer belongs to the
    running call. A buffer no call has needed whole for ``SCRATCH_IDLE`` seconds is given back by
    ``sweep`` at the group's next call (``Ctx.of`` runs it when one is due); the next take of its
    purpose then allocates what it needs. A group thus holds what its
    recent calls used, not the largest call it ever made, and a shape that recurs pays for fresh
    pages at most once per ``SCRATCH_IDLE``.
    Buffers above ``config.SCRATCH_KEEP_BYTES`` are not kept.
    """

    __slots__ = ("_held", "sweep_at")

    def __init__(self) -> None:
        self._held: dict[str, list[Any]] = {}  # purpose -> [buffer, when a take last needed it whole]
        self.sweep_at = 0.0  # when ``sweep`` is due next

    def take(self, purpose: str, count: int, dtype: np.dtype) -> np.ndarray:
        """``count`` elements of ``dtype`` (a ``np.dtype``) for ``purpose``, this call's to use."""
        nbytes = count * dtype.itemsize
        now = _monotonic()
        entry = self._held.get(purpose)
        if entry is None or entry[0].size < nbytes:
            held = np.empty(nbytes, np.uint8)
            if nbytes <= config.SCRATCH_KEEP_BYTES:
                self._held[purpose] = [held, now]
            return held.view(dtype)
        held = entry[0]
        if nbytes == held.size:
            entry[1] = now
        return held[:nbytes].view(dtype)

    def sweep(self, now: float) -> None:
        """Give back the buffers no take needed whole for ``SCRATCH_IDLE`` seconds before ``now``;
        the next sweep is due when the oldest of the others has been idle that long."""
        for purpose in [p for p, (_, used) in self._held.items() if now - used >= SCRATCH_IDLE]:
            del self._held[purpose]
        self.sweep_at = min((used for _, used in self._held.values()), default=now) + SCRATCH_IDLE

    def clear(self) -> None:
        """Let go of every kept buffer."""
        self._held.clear()


@dataclass(frozen=True)
class Team:
    """What every call on one group shares; the core builds it once per group.

    Attributes:
        transport: moves bytes between global ranks.
        ranks: global rank of each group rank.
        rank: this process's group rank.
        group_id: small integer naming the group in tags.
        timeout: seconds one call may take.
        host_of: host identity of each group rank (same string = same host), for topology-aware
            selection.
        group_name: the group's name, for error messages.
        shm: the group's shared-memory domain (``transports.shm.domain.ShmDomain``) when every
            member shares this host and shared memory could be set up; else None.
        hier: the group's ``Hierarchy`` when it spans hosts that hold as many members each
            (``algorithms/hier.py``); else None.
        whole: for a host or cross team of a hierarchical group, the global ranks of the whole
            group (a timeout asks them too where they are); else empty.
        keep_going: a failed call must leave the caller's in-place arrays untouched or complete
            (the job goes on after failures: ``init(keep_going=True)``); else they are
            unspecified.
        learning: the group's learners (``learning.Board``) when its members learn which
            algorithms run (a shared-memory group whose members all allow it); else None.
        size: the number of members (``len(ranks)``; derived, not passed).
        scratch: the group's reused working memory (``Scratch``), freed with the group.
    """

    transport: Transport
    ranks: Sequence[int]
    rank: int
    group_id: int
    timeout: float
    host_of: Sequence[str] = ()
    group_name: str = ""
    shm: Any = None
    hier: Hierarchy | None = None
    whole: Sequence[int] = ()
    keep_going: bool = False
    learning: Any = None
    size: int = field(init=False)
    scratch: Scratch = field(init=False, default_factory=Scratch)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", len(self.ranks))


class Plan:
    """One call shape on one group (collective, dtype, sizes, op, root), worked out once by the
    core and kept by the group, so that repeated calls of a shape cost a dictionary lookup.

    Attributes:
        label: ``"all_reduce on group 'world'"``, for messages.
        signature: what the call is; peers compare it with theirs.
        algorithm: the name of the chosen algorithm (``select``'s row).
        run: the chosen algorithm (``select``'s calling convention for the collective).
        op: the call's reduction, parsed and checked against the dtype (None if it has none).
        reduction: how to reduce: ``op``'s descriptor for the dtype (``kernels.reduction``),
            made once with the plan; None if the call reduces nothing.
        state: the algorithm's own set-up for this shape (slot views, bounds...): what its
            row's ``prepare`` made when the plan was made (``make_plan``), else None; gone with
            the group.
        bind: the row's ``bind`` (for persistent calls), else None.
        choices: for a shape whose algorithm is learned (``learning.Choices``), the plan of
            each candidate and what picks one per call: the core runs ``choices.choose()``'s
            plan instead of this one; else None.
        learned: for the plan of one candidate of such a shape, the shape's ``choices`` (what it
            has settled on: ``choices.settled()``); else None.
    """

    __slots__ = ("label", "signature", "algorithm", "run", "op", "reduction", "state", "bind", "choices",
                 "learned", "design")

    def __init__(self, label: str, signature: Signature, algorithm: str,
                 run: Callable[..., Any], op: Any = None, reduction: Reduction | None = None) -> None:
        self.label = label
        self.signature = signature
        self.algorithm = algorithm
        self.run = run
        self.op = op
        self.reduction = reduction
        self.state: Any = None
        self.bind: Bind | None = None
        self.choices: Any = None
        self.learned: Any = None
        self.design = 0


def design(row: Row) -> int:
    """A code of ``row``'s algorithm that every process computes alike, which a shared-memory
    call announces beside its signature (``Slots.start``), so that members that run different
    algorithms for one call (their ``TENSORCOMM_ALGORITHMS``, keep-going setting or tuning file
    differ) fail it with ``CollectiveMismatchError`` on every member instead of reading each
    other's slots as something else. all_to_all's shared-memory designs share one code: members
    may pick them by their own sizes, and they meet (``shm_cma.READS_EXTENT``)."""
    name = "shm" if row.collective == "all_to_all" and row.name.startswith("shm_") else row.name
    return zlib.crc32(f"{row.collective}/{name}".encode())


def make_plan(row: Row, label: str, signature: Signature, team: Team, args: Sequence[Any],
              op: Any = None, reduction: Reduction | None = None) -> Plan:
    """The plan that runs ``row`` for one call shape, its state prepared (``Row.prepare``) from
    ``args``, the shape's first call's arguments; ``op`` and its ``reduction`` for reductions.

    Raises:
        ValueError: the row cannot run on ``team`` (a shared-memory row, by override, on a
            group without a domain).
    """
    plan = Plan(label, signature, row.name, row.fn, op, reduction)
    plan.design = design(row)
    if row.prepare is not None:
        plan.state = row.prepare(team, plan, *args)
    plan.bind = row.bind
    return plan


class Ctx:
    """One collective call's view of its group: the group's ``Team`` and the call's ``Plan``.

    Attributes:
        team: what the group's calls share (the attributes below read through it).
        plan: what the call's shape shares with other calls of that shape.
        seq: the call's sequence number in the group.
        name: the collective's name, for error messages (the plan's label; read through it).
        signature: what this call is (the plan's); peers compare it with theirs.
        design: the plan's algorithm's code (``design``); peers compare it with theirs.
        deadline: ``time.monotonic()`` value the call must finish by.

    Made by ``Ctx.of`` from the group's team and the call's plan, which costs six attribute
    stores, a clock read and a look at whether the group's scratch is due a sweep: every call
    makes one, so whatever only some calls need (the messages' tags, the name for errors) is
    worked out where it is used.
    """

    __slots__ = ("team", "plan", "seq", "signature", "design", "deadline")
    team: Team
    plan: Plan
    seq: int
    signature: Signature
    design: int
    deadline: float

    @classmethod
    def of(cls, team: Team, seq: int, plan: Plan) -> Ctx:
        """A call's context on ``team``; its deadline starts now."""
        ctx = _new(cls)
        ctx.team = team
        ctx.plan = plan
        ctx.seq = seq
        ctx.signature = plan.signature
        ctx.design = plan.design
        now = _monotonic()
        ctx.deadline = now + team.timeout
        if now >= team.scratch.sweep_at:  # scratch idle for long is given back (``Scratch``)
            team.scratch.sweep(now)
        return ctx

    name = property(attrgetter("plan.label"), doc="The collective's name, for messages.")

    transport = property(attrgetter("team.transport"), doc="Moves bytes between global ranks.")
    ranks = property(attrgetter("team.ranks"), doc="Global rank of each group rank.")
    rank = property(attrgetter("team.rank"), doc="This process's group rank.")
    group_id = property(attrgetter("team.group_id"), doc="Small integer naming the group in tags.")
    timeout = property(attrgetter("team.timeout"), doc="Seconds the whole call may take.")
    host_of = property(attrgetter("team.host_of"), doc="Host identity of each group rank.")
    group_name = property(attrgetter("team.group_name"), doc="The group's name.")
    shm = property(attrgetter("team.shm"), doc="The group's shared-memory domain, or None.")

    size = property(attrgetter("team.size"), doc="The number of members.")

    def remaining(self) -> float:
        """Seconds left before the call's deadline (raise if none)."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise CommTimeoutError(f"{self.name} timed out after {self.timeout:g} s")
        return left

    def isend(self, peer: int, buf: np.ndarray, step: int = 0) -> Request:
        """Start sending ``buf`` (1-D, C-contiguous) to group rank ``peer``."""
        team = self.team
        tag = collective_tag(team.group_id, self.seq, step)  # raises ValueError for a bad step
        return team.transport.isend(team.ranks[peer], buf.view(_BYTE).data, tag, self.signature)

    def irecv(self, peer: int, buf: np.ndarray, step: int = 0) -> Request:
        """Post a receive into ``buf`` (1-D, C-contiguous) from group rank ``peer``."""
        team = self.team
        tag = collective_tag(team.group_id, self.seq, step)  # raises ValueError for a bad step
        return team.transport.irecv(team.ranks[peer], buf.view(_BYTE).data, tag, self.signature)

    def exchange(self, receives: Sequence[tuple[int, np.ndarray]], sends: Sequence[tuple[int, np.ndarray]],
                 step: int = 0) -> Request:
        """Post a receive into each ``(peer, buf)`` of ``receives``, then start sending each of
        ``sends`` (group ranks, each at most once per list; 1-D, C-contiguous buffers), all in one
        transport call (``Transport.exchange``): one request, waited for with ``wait``."""
        team = self.team
        tag = collective_tag(team.group_id, self.seq, step)  # raises ValueError for a bad step
        ranks = team.ranks
        return team.transport.exchange([(ranks[peer], buf.view(_BYTE).data) for peer, buf in receives],
                                       [(ranks[peer], buf.view(_BYTE).data) for peer, buf in sends],
                                       tag, self.signature)

    def wait(self, request: Request) -> None:
        """Wait for ``request`` within the call's deadline.

        A failure here dooms the whole call on every member, so the group is aborted on every
        peer at once: members waiting on someone else learn of it now, not at their timeout.
        """
        try:
            # A request that already ended carries its own verdict (a relayed abort, a stalled
            # send naming its peer): ``wait`` reads it before the deadline can hide it.
            left = self.deadline - _monotonic()
            try:
                request.wait(max(0.0, min(STALL_PROBE_SECONDS, left)))
            except CommTimeoutError:
                if not request.done():  # this wait's own timeout, not the request's verdict
                    self._wait_watching(request, left > STALL_PROBE_SECONDS)
                request.wait(0)
        except CommError as exc:
            if isinstance(exc, CommTimeoutError) and not request.done():  # this rank's own wait
                error = CommTimeoutError(f"{self.name} (group rank {self.rank}) timed out after "
                                         f"{self.timeout:g} s: {self._who_is_missing() or exc}")
                self.transport.abort_group(self.group_id, error)
                raise error from None
            self.transport.abort_group(self.group_id, exc)
            raise

    def _wait_watching(self, request: Request, stalled: bool) -> None:
        """Wait until ``request`` is done or the deadline passes, asking the peers where they
        are whenever the wait stalls (at once if it ``stalled`` already, ``STALL_PROBE_SECONDS``).

        Raises:
            CollectiveMismatchError: a peer is in another call at this step.
            CommTimeoutError: the deadline passed.
        """
        stall = STALL_PROBE_SECONDS
        if stalled and not request.done():
            self._check_peers()
            stall *= 2
        while not request.done():
            left = self.remaining()
            try:
                request.wait(min(stall, left))
            except CommTimeoutError:
                if stall < left and not request.done():
                    self._check_peers()
                    stall *= 2

    def _check_peers(self) -> None:
        """Raise CollectiveMismatchError if a peer reports another call at this step."""
        me = self.ranks[self.rank]
        reached = self.transport.progress(self.group_id, [r for r in self.ranks if r != me],
                                          PROGRESS_PROBE_SECONDS)
        for rank, answer in reached.items():
            if answer is not None and answer[0] == self.seq and answer[1] not in (None, self.signature):
                raise CollectiveMismatchError(
                    f"rank {rank} called {answer[1].describe()} while rank {me} called "
                    f"{self.signature.describe()} at step {self.seq} of group {self.group_name!r} "
                    f"(found when the wait stalled)")

    def _who_is_missing(self) -> str:
        """Ask the peers how far they got, to name the ranks that did not arrive at this call.

        A host or cross team of a hierarchical group asks the whole group's members too: one
        stopped on another host holds up its host-mates, who would otherwise look merely late
        here. Ranks that do not answer are named first; those behind may be waiting for them.
        """
        team = self.team
        me = team.ranks[team.rank]
        asked = [rank for rank in dict.fromkeys((*team.ranks, *team.whole)) if rank != me]
        reached = self.transport.progress(self.group_id, asked, PROGRESS_PROBE_SECONDS)
        silent = [rank for rank in asked if reached.get(rank, ()) is None]
        behind = [rank for rank in team.ranks if rank != me and (answer := reached.get(rank)) is not None
                  and answer[0] < self.seq]
        parts = []
        if silent:
            parts.append(f"{_names(silent)} did not answer (stopped, hung or unreachable)")
        if behind:
            waiting = " (waiting for them, perhaps)" if silent else ""
            parts.append(f"{_names(behind)} had not reached this call{waiting}")
        return "; ".join(parts)

    def send(self, peer: int, buf: np.ndarray, step: int = 0) -> None:
        """Send ``buf`` to group rank ``peer`` and wait until it may be reused."""
        self.wait(self.isend(peer, buf, step))

    def recv(self, peer: int, buf: np.ndarray, step: int = 0) -> None:
        """Receive exactly ``buf.nbytes`` bytes from group rank ``peer`` into ``buf``."""
        self.wait(self.irecv(peer, buf, step))

    def acknowledge(self, peer: int) -> None:
        """Tell group rank ``peer``, which only sends in this call, that its message was taken.

        A rank that receives nothing in a call (a broadcast or scatter root, a gather sender, a
        reduce leaf) would otherwise finish it without learning whether its peers made the same
        call; the empty acknowledgement carries this rank's signature back, so a mismatch (a
        different root, an extra call) fails the call on both sides instead of passing silently.
        """
        self.send(peer, _NOTHING, ACK_STEP)

    def acknowledged(self, peers: Sequence[int]) -> None:
        """Wait for the acknowledgements of ``peers`` (group ranks); see ``acknowledge``."""
        for request in [self.irecv(peer, _NOTHING, ACK_STEP) for peer in peers]:
            self.wait(request)

    def sendrecv(self, dst: int, send_buf: np.ndarray, src: int, recv_buf: np.ndarray,
                 step: int = 0) -> None:
        """Send to ``dst`` while receiving from ``src``; never deadlocks on socket buffers."""
        pending = self.irecv(src, recv_buf, step)
        self.send(dst, send_buf, step)
        self.wait(pending)


def _names(ranks: Sequence[int]) -> str:
    """``rank 2`` / ``rank 2, rank 3``: every rank spelled out, so messages are easy to search."""
    return ", ".join(f"rank {rank}" for rank in ranks)
