"""``Group``: which ranks take part, how group ranks map to global ranks, and where calls run.

Each group owns an ``Engine`` (issue order and sequence numbers), a ``Team`` (what the
algorithms see of the group: transport, ranks, and the shared-memory domain when every member
shares this host, and the scratch memory its calls reuse), its ``Plan`` per call shape (a
bounded dictionary: the only cache of the per-call path), both gone with the group, and builds
one ``Ctx`` per call from them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ..algorithms.base import Ctx, Hierarchy, Plan, Team
from ..algorithms.learning import Board, Learner
from ..config import MAX_TIMEOUT
from ..errors import CommError, ConcurrentUseError, GroupAbortedError, PeerLostError
from ..trace import recorder
from ..types import TransportKind
from .elastic import Registry, agree
from .engine import Engine
from .split import split as split_by_color
from .work import Work

PLANS_KEPT = 256  # call shapes a group remembers; the oldest is forgotten beyond that
AT_START = -2  # the record index ``_call`` gets for a call the recorder learns of as it starts
ABORT_GRACE = 0.25  # seconds a call that lost a peer waits for the abort that may explain it

if TYPE_CHECKING:
    from ..rendezvous.init_method import Rendezvous
    from ..transports.mpi.transport import MpiTransport
    from ..transports.shm.domain import ShmDomain
    from ..transports.tcp.transport import TcpTransport


class CallInfo(NamedTuple):
    """What ran a call: ``collective`` (``"all_reduce"``), ``algorithm`` (a row of
    docs/algorithms.md, e.g. ``"shm_direct"``), ``transport`` (``"shm"``, ``"tcp"``,
    ``"mpi"``, ``"loopback"``, or ``"hier"``: shared memory within hosts, the transport between)
    and ``settled``: the algorithm the call's shape runs outside learning's trials
    (docs/tuning.md), which differs from ``algorithm`` only when the call was a trial."""

    collective: str
    algorithm: str
    transport: str
    settled: str


class World(Registry, Protocol):
    """The world a group belongs to, as its groups and their users see it (``core.world.World``
    is the one; named here so that ``group.py`` need not import ``world.py``, which imports it)."""

    size: int
    timeout: float
    keep_going: bool
    algorithms: dict[str, str]  # collective -> algorithm (``TENSORCOMM_ALGORITHMS``)
    forked: RuntimeError | None  # set in a child forked from a rank
    world_group: Group

    @property
    def transport(self) -> TcpTransport | MpiTransport: ...

    @property
    def rendezvous(self) -> Rendezvous: ...

    def hosts_of(self, ranks: Sequence[int]) -> tuple[str, ...]: ...

    def new_group(self, ranks: Sequence[int], name: str | None = None) -> Group: ...

    def named_group(self, name: str) -> Group: ...

    def adopt(self, ranks: tuple[int, ...], group_id: int, label: str, shm: ShmDomain | None) -> Group: ...

    def forget(self, group: Group) -> None: ...

    def segment_exchange(self, prefix: str, ranks: Sequence[int],
                         abandon: Callable[[], str | None] | None = None) -> tuple[
            Callable[[str], None], Callable[[float], str | None], Callable[[], str | None]]: ...


class Group:
    """An ordered set of global ranks that run collectives together.

    Every member must issue the same collectives on a group in the same order. A process that
    is not a member holds a ``Group`` too (``is_member`` is False); using it raises ValueError.
    """

    def __init__(self, name: str, ranks: Sequence[int], group_id: int, world: World,
                 shm: ShmDomain | None = None, hier: Hierarchy | None = None,
                 parts: Sequence[Group] = (), whole: Sequence[int] = ()) -> None:
        self._name = name
        self._ranks = tuple(ranks)
        self._group_id = group_id
        self._world = world
        self._index = {g: i for i, g in enumerate(self._ranks)}
        self._engine = Engine(name)
        self._shm = shm
        self._parts = tuple(parts)  # the internal groups behind ``hier``'s sub-teams
        self._team: Team | None = None
        if world.rank in self._index:
            self._team = Team(world.transport, self._ranks, self._index[world.rank], group_id,
                              world.timeout, world.hosts_of(self._ranks), name, shm, hier, whole,
                              keep_going=world.keep_going,
                              learning=Board(shm.slots) if shm is not None and shm.learning else None)
        # One plan per call shape (``core/collectives.py`` makes them), gone with the group.
        self._plans: dict[Hashable, Plan] = {}
        self._shrinks = 0  # calls of shrink() so far: the members match them by this count
        self._last_plan: Plan | None = None  # the plan of the latest call that ran (last_call)
        self._requests: weakref.WeakSet[Request] = weakref.WeakSet()  # persistent calls made on it
        self._inside = Inside(self)  # what the core's modules use of it (``inside``)

    # The WORLD handle overrides this to follow whichever world is current.
    def _target(self) -> Group:
        return self

    @property
    def name(self) -> str:
        """The group's name (``"world"`` for the world group)."""
        return self._target()._name

    @property
    def ranks(self) -> tuple[int, ...]:
        """Global ranks of the members, in group-rank order."""
        return self._target()._ranks

    @property
    def size(self) -> int:
        """Number of members."""
        return len(self._target()._ranks)

    @property
    def is_member(self) -> bool:
        """Whether this process belongs to the group."""
        return self._target()._team is not None

    @property
    def transport_kind(self) -> TransportKind:
        """How this group's collectives move data: ``SHM`` when every member shares this host
        (and ``TENSORCOMM_TRANSPORT`` is not ``tcp``), else ``TCP``.

        Raises:
            ValueError: this process is not a member.
        """
        target = self._target()
        target._member_team()
        return TransportKind.TCP if target._shm is None else TransportKind.SHM

    @property
    def rank(self) -> int:
        """This process's rank within the group.

        Raises:
            ValueError: this process is not a member.
        """
        target = self._target()
        return target.group_rank(target._world.rank)

    @property
    def last_call(self) -> CallInfo | None:
        """Which collective, algorithm and transport this process's latest call on the group ran
        (None before the first). For a blocking call, read it after the call returns; an
        ``async_op=True`` call's ``Work`` says the same (``work.algorithm``, ``work.transport``).

        Raises:
            ValueError: this process is not a member.
        """
        target = self._target()
        team = target._member_team()
        plan = target._last_plan
        if plan is None:
            return None
        learned = plan.learned  # a candidate of a shape that learns: its incumbent is what it settled on
        return CallInfo(plan.label.split(" ", 1)[0], plan.algorithm, recorder.transport_name(team),
                        plan.algorithm if learned is None else learned.settled())

    def group_rank(self, global_rank: int) -> int:
        """Translate a global rank to this group's rank.

        Raises:
            ValueError: ``global_rank`` is not a member.
        """
        target = self._target()
        try:
            return target._index[global_rank]
        except (KeyError, TypeError):
            raise target._not_member(global_rank) from None

    def _not_member(self, global_rank: object) -> ValueError:
        return ValueError(f"global rank {global_rank!r} is not a member of group "
                          f"{self._name!r} (ranks {list(self._ranks)})")

    def _member_team(self) -> Team:
        """This process's ``Team`` in the group: what the algorithms see of it.

        Raises:
            ValueError: this process is not a member.
        """
        target = self._target()
        team = target._team
        if team is None:
            raise target._not_member(target._world.rank)
        return team

    def global_rank(self, group_rank: int) -> int:
        """Translate a rank of this group to the global rank.

        Raises:
            ValueError: ``group_rank`` is outside ``0 .. size-1``.
        """
        target = self._target()
        if isinstance(group_rank, bool) or not isinstance(group_rank, int) \
                or not 0 <= group_rank < len(target._ranks):
            raise ValueError(f"group rank {group_rank!r} is outside group {target._name!r} "
                             f"of size {len(target._ranks)}")
        return target._ranks[group_rank]

    # -- used by the core's collectives ---------------------------------------------------------

    def _keep_plan(self, key: Hashable, plan: Plan) -> Plan:
        """Keep ``plan`` for the call shape ``key`` (``_plans``), forgetting the oldest beyond
        ``PLANS_KEPT``; return it."""
        plans = self._target()._plans
        if len(plans) >= PLANS_KEPT:
            del plans[next(iter(plans))]
        plans[key] = plan
        return plan

    def _run(self, plan: Plan, async_op: bool, *args: Any) -> Work | Any:
        """Run ``plan``'s algorithm on ``args`` in this group's issue order (``_execute`` runs it):
        a blocking call now, on this thread, unless a call runs or waits ahead of it (then it
        queues, and this thread waits for it: ``_submit``); an ``async_op`` call queued.

        A call that fails ends the group on every member (see ``_failed``).
        """
        target = self if type(self) is Group else self._target()  # frontends pass resolved groups
        team = target._team
        if team is None:
            raise target._not_member(target._world.rank)
        if not async_op:
            engine = target._engine
            seq = engine.enter()
            if seq < 0:
                return target._submit((target, plan, args, AT_START), False)
            try:
                return _execute(seq, target, plan, args, AT_START)
            finally:
                engine.leave()
        # a blocking call is recorded as it starts (``_execute``), a queued one now
        work = target._submit((target, plan, args, recorder.issue(team, plan)), True)
        work.algorithm, work.transport = plan.algorithm, recorder.transport_name(team)
        if plan.choices is not None:  # learned: what ran is known when it has run
            work._on_done(_ran(plan.choices.learner))
        return work

    def _submit(self, job: Job, async_op: bool, defer: bool = False) -> Work | Any:
        """Hand ``job`` (``_call``'s) to the engine (``Engine.submit``); a call from a second
        thread while the first's are in flight ends the group on every member."""
        try:
            return self._engine.submit(job[1].label, _call, async_op, job, defer)
        except ConcurrentUseError as exc:  # the ranks' orders may differ already: end the group
            self.abort(f"calls from two threads at once ({exc})")
            raise

    def _record_issued(self, plan: Plan) -> int:
        """Record a call of ``plan`` that is queued now, with its caller's site (``recorder.issue``)."""
        return recorder.issue(self._member_team(), plan)

    def destroy(self) -> None:
        """Leave this group on this process: free its shared memory and fail its pending and
        later calls here with ``GroupAbortedError``; the world and other groups go on.

        Not collective: members that still wait on this one for a call it never made get
        ``PeerLostError``. Destroying the world group is ``tensorcomm.destroy()``.

        Raises:
            ValueError: this process is not a member, or the group is the world group.
        """
        target = self._target()
        world = target._world
        target._member_team()
        if target is world.world_group:
            raise ValueError("destroy: the world group ends with tensorcomm.destroy()")
        error = GroupAbortedError(f"group {target._name!r} was destroyed on rank {world.rank}")
        world.transport.abort_group(target._group_id, error, tell_peers=False)
        target._stop(error)
        world.forget(target)

    def abort(self, reason: str = "aborted") -> None:
        """End the group at once, from any thread, on every member.

        Pending and later calls on the group fail with ``GroupAbortedError`` here and on the
        other members (who are told over the same links a failed call uses). The world and other
        groups go on.

        Raises:
            ValueError: this process is not a member.
        """
        target = self._target()
        world = target._world
        target._member_team()
        error = GroupAbortedError(f"group {target._name!r} was aborted by rank {world.rank}: {reason}")
        for group in (target, *target._parts):
            world.transport.abort_group(group._group_id, error)
            if group._shm is not None:
                group._shm.abort(error)
        target._engine.stop(error)

    def split(self, color: int | None, key: int = 0) -> Group | None:
        """Split the group by ``color``, as MPI's ``Comm_split``: a collective of its members.

        Members that pass the same color form a new group, ordered by ``key``, then by their rank
        in this group; a member that passes None (or a negative color) gets no group. Each new
        group is made as ``new_group`` makes one (on shared memory when its members share a host).

        Args:
            color: which new group this member joins; None or negative: none.
            key: this member's place in its new group (ties keep this group's order).

        Returns:
            This member's new group, or None.

        Raises:
            TypeError: ``color`` is not an int or None, or ``key`` is not an int.
            ValueError: this process is not a member, or a value does not fit in 64 bits.
            CollectiveMismatchError: another member made a different call at this step.
        """
        target = self._target()
        world = target._world
        members = split_by_color(target._inside, color, key, world.algorithms.get("all_gather"))
        return None if members is None else world.new_group(members)

    def shrink(self, timeout: float | None = None) -> Group:
        """Agree with the other live members on who is left, and return a new group of them.

        ULFM's ``MPIX_Comm_shrink``: a collective of the members that are still alive, called
        after a ``CommError`` on this group (or on a healthy group). Every survivor gets the same
        members, renumbered ``0..k-1`` in this group's order, in a new group (on shared memory
        when they share a host). The agreement survives further failures while it runs. This
        group stays as it was (unusable if it failed; aborted on every member if the agreement
        left someone out); ``destroy()`` it when done. docs/elastic.md has the whole model.

        Args:
            timeout: seconds to wait for members that neither arrive nor are known to be dead;
                they are then left out. Default: the group's timeout.

        Raises:
            ExcludedError: the other members agreed without this rank (it came too late, say);
                it cannot rejoin them.
            RendezvousError: the store is gone. It must outlive the ranks that fail, as the
                launcher's and torchrun's do; a store rank 0 hosts does not.
            ValueError: this process is not a member, or ``timeout`` is not a positive number.
            RuntimeError: this process was forked from a rank after ``init()``.
        """
        target = self._target()
        world = target._world
        target._member_team()
        if world.forked is not None:
            raise world.forked
        if timeout is None:
            timeout = world.timeout
        elif isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"shrink: timeout must be a positive number of seconds, got {timeout!r}")
        n, target._shrinks = target._shrinks, target._shrinks + 1
        agreed = agree(world, target._group_id, n, target._ranks, target._name,
                       min(float(timeout), MAX_TIMEOUT))
        group = world.adopt(agreed.ranks, agreed.group_id, f"{target._name}/shrink{n}", agreed.shm)
        if len(agreed.ranks) < len(target._ranks):  # stragglers' calls on this group must fail
            target.abort(f"the group shrank to ranks {list(agreed.ranks)}")
        return group

    def _stop(self, error: BaseException) -> None:
        """Fail pending and later calls with ``error``; leave the shared-memory domain."""
        if self._shm is not None:
            self._shm.abort(error, tell_peers=False)  # peers learn we left from close()
        self._engine.stop(error)
        for request in self._requests:  # its bound round and plan hold views of the domain's memory
            request.drop()
        for plan in (*self._plans.values(), self._last_plan):  # ``last_call`` keeps one
            if plan is not None:
                plan.state = None  # views of the domain's memory: it cannot close under them
                if plan.choices is not None:
                    plan.choices.drop()
        self._plans.clear()
        if self._team is not None:
            self._team.scratch.clear()
        if self._shm is not None:
            self._shm.close()
        for part in self._parts:
            part._stop(error)

    def __repr__(self) -> str:
        return f"Group(name={self.name!r}, ranks={list(self.ranks)})"


class Request(Protocol):
    """A persistent request as its group sees it (``core.persistent.Prequest``)."""

    def drop(self) -> None:
        """Let go of what it holds of the group's shared memory."""


def inside(group: Group) -> Inside:
    """``group`` as tensorcomm's own core uses it (``Inside``)."""
    return group._target()._inside


class Inside:
    """A group as the core's other modules use it (the collectives' descriptions, split, shared
    arrays, point-to-point, the world, persistent requests and their bound runs): the group's
    internal interface, so that they name what they use instead of reading and writing its
    private fields (``inside(group)``). Made once, with the group: ``plans`` is the group's own
    dictionary and ``run`` its bound ``_run``, so a collective's call reads them as it would
    the group's (``collectives.Caller``). Bound runs of persistent requests keep what they touch
    on every run.

    Attributes:
        group: the group.
        plans: the plans kept per call shape (``Group._keep_plan``).
        run: ``run(plan, async_op, *args)``: run ``plan`` on ``args`` in the group's issue order,
            returning a ``Work`` for ``async_op`` (``Group._run``).
        learns: its plans may learn their algorithm (``algorithms/learning.py``).
    """

    __slots__ = ("group", "plans", "run")
    learns = True

    def __init__(self, group: Group) -> None:
        self.group = group
        self.plans: dict[Hashable, Plan] = group._plans  # never reassigned: cleared in place
        self.run: Callable[..., Work | Any] = group._run

    @property
    def name(self) -> str:
        return self.group._name

    @property
    def world(self) -> World:
        return self.group._world

    @property
    def group_id(self) -> int:
        return self.group._group_id

    @property
    def engine(self) -> Engine:
        """The group's issue order; replaced only in a forked child (``World._inherited``)."""
        return self.group._engine

    @engine.setter
    def engine(self, engine: Engine) -> None:
        self.group._engine = engine

    @property
    def shm(self) -> ShmDomain | None:
        return self.group._shm

    @property
    def requests(self) -> weakref.WeakSet[Request]:
        """The persistent requests made on the group."""
        return self.group._requests

    def team(self) -> Team:
        """This member's team (``Group._member_team``: raises ValueError for a non-member)."""
        return self.group._member_team()

    def keep_plan(self, key: Hashable, plan: Plan) -> Plan:
        return self.group._keep_plan(key, plan)

    def now(self, plan: Plan, args: tuple[Any, ...]) -> Any:
        """Run ``plan`` blocking, in issue order (``Group._run``)."""
        return self.run(plan, False, *args)

    def queue(self, plan: Plan, args: tuple[Any, ...]) -> Work:
        """Issue ``plan`` deferred: queued now, run when this thread next waits or calls."""
        group = self.group
        work: Work = group._submit((group, plan, args, group._record_issued(plan)), True, True)
        return work

    def stop(self, error: BaseException) -> None:
        """Fail pending and later calls with ``error`` (``Group._stop``)."""
        self.group._stop(error)


Job = tuple["Group", Plan, tuple[Any, ...], int]  # _execute's arguments after seq


def _call(seq: int, job: Job) -> Any:
    """Run a call the engine queued: ``_execute`` with ``job``'s arguments."""
    return _execute(seq, *job)


def _execute(seq: int, group: Group, plan: Plan, args: tuple[Any, ...], index: int) -> Any:
    """Run call ``seq`` of ``group``: ``plan``'s algorithm on ``args``, in a new context. The one
    place every collective call runs, ordinary or persistent, inline or queued (the engine runs
    them in issue order), and tells the flight recorder
    (``trace.recorder``) that it started, ended or failed: ``index`` is the call's record for a
    queued call (-1 when the recorder is off), ``AT_START`` for a call recorded as it starts.

    A call that fails ends the group on every member (``_failed``), then raises what explains
    the failure best (``_cause``).
    """
    if plan.choices is not None:  # learned (``algorithms/learning.py``): a candidate's plan runs
        plan = plan.choices.choose()
    group._last_plan = plan
    ctx = _ctx_of(group._team, seq, plan)  # type: ignore[arg-type]  # a member's group runs calls
    if index == AT_START:
        index = _begin(ctx.team, plan, seq)
    elif index >= 0:
        recorder.started(index, seq, plan)
    try:
        result = plan.run(ctx, *args)
    except BaseException as exc:
        cause = _failing(ctx, exc, index)
        if cause is exc:
            raise
        raise cause from exc
    if index >= 0:
        _done(index)
    return result


def _ran(learner: Learner) -> Callable[[Work], None]:
    """A done hook that names the candidate ``learner`` ran last (the call's own: the hook runs
    right after it, before the engine runs another) in the ``Work``."""
    def name(work: Work) -> None:
        work.algorithm = learner.names[learner.last]
    return name


_ctx_of = Ctx.of
_begin = recorder.begin
_done = recorder.done


def _failing(ctx: Ctx, error: BaseException, index: int) -> BaseException:
    """A call failed with ``error``: end the group on every member (``_failed``), the peers
    first, at once, and tell the flight recorder (its record ``index``; -1: none); return what
    the call raises (``_cause``)."""
    _failed(ctx, error)
    cause = _cause(ctx, error)
    if index >= 0:
        recorder.end(index, cause)
    return cause


def _cause(ctx: Ctx, error: BaseException) -> BaseException:
    """What a call that failed with ``error`` reports (the peers were told already): a sequence
    mismatch for a peer that left (``_left_before``), for a peer whose link broke the failure
    another member reported of its own (it failed first; a peer that then exited is a
    consequence), else ``error``."""
    if not isinstance(error, PeerLostError):
        return error
    if error.left:
        return _left_before(ctx, error) or error
    return ctx.transport.abort_cause(ctx.group_id, ABORT_GRACE) or error


def _left_before(ctx: Ctx, error: BaseException) -> PeerLostError | None:
    """If ``error`` says a peer called ``destroy()`` while this rank waited for it in a call, the
    peer never made that call: the ranks' call sequences differ (an extra call on one rank, or a
    missing one on the other, which no signature check can see when the calls look alike).
    Return an error that says so, or None for any other error."""
    if not isinstance(error, PeerLostError) or not error.left:
        return None
    them = (f"; its last call in the group was step {error.last_step}"
            if error.last_step is not None else "")
    return PeerLostError(error.rank, (
        f"sequence mismatch: it left (destroy() was called) while rank {ctx.ranks[ctx.rank]} waited "
        f"for it in {ctx.name} at step {ctx.seq}{them}; the "
        f"ranks' call sequences differ (this rank made a call rank {error.rank} did not make)"),
        left=True, last_step=error.last_step)


def _failed(ctx: Ctx, error: BaseException) -> None:
    """A call failed on this rank (a peer's error, or a local one: MemoryError, Ctrl-C): the
    peers cannot finish it, so the group ends on every member at once. On shared memory the
    counters are out of step now; over TCP the peers would wait for messages that never come.
    A hierarchical group's sub-teams are out of step too: they end with it."""
    shm = ctx.team.shm
    if shm is not None:
        shm.fail(error, ctx)
        return
    if not isinstance(error, CommError):  # a transport's own errors travel as they are
        me = ctx.ranks[ctx.rank]
        error = GroupAbortedError(f"rank {me} failed in {ctx.name} (step {ctx.seq}): "
                                  f"{type(error).__name__}: {error}")
    hier = ctx.team.hier
    if hier is not None:
        if hier.host.shm is not None:
            hier.host.shm.fail(error, ctx)
        ctx.transport.abort_group(hier.cross.group_id, error)
    ctx.transport.abort_group(ctx.group_id, error)
