"""``Bound``: a persistent call bound to its group, plan and arrays: what each run of it runs.

A persistent request (``core.persistent.Prequest``) makes one when it is made. Where the
algorithm binds the call as one round of the shared-memory protocol (``Row.bind`` made a
``OneRound``: the small all_reduce, all_gather, reduce_scatter, broadcast and all_to_all), a run
is that round's steps, each a public method of the object that owns it:

- the engine's ``enter`` and ``leave`` (the call's step in the group's issue order), or ``park``
  for a run that returns after its post;
- the flight recorder's ``begin`` and ``done``;
- the domain's ``next_round`` and the slots' ``start``, or its two halves ``announce`` and
  ``meet`` (post this member's part; wait for every peer's and compare what they announced);
- the round's own ``put`` and ``take`` (the algorithm's copies, bound to the arrays);
- the group's one failure handler (``group._failing``) when anything fails, as for every call.

``run_round`` takes them all at once (the request's ``request()``). ``post`` takes the first half
and parks the rest on the engine (``start()``, as ``MPI_Start`` posts this rank's part and
returns): ``finish`` (meet, take, done) runs when the request's ``wait()`` comes, or first thing in
the group's next call; where every peer's post is there already, ``post`` runs it at once and parks
nothing (as an MPI library progresses a request inside ``MPI_Start``), unless the first round
was not the whole call (``OneRound.whole``): neither ``start()`` nor ``test()`` waits for a peer.
A round whose algorithm may go on with more rounds (``OneRound.finish``: all_to_all, where a
peer's block does not fit one slot) is parked *watched*: its peers may wait for its later rounds,
so the engine's worker finishes it if this thread has not come back within
``engine.DEFER_SECONDS``, as it runs a deferred call, and a thread that waits on something else
first cannot hang its peers. Whatever cannot run so (a
call queued or parked ahead, the group stopped, a plan not bound as one round) goes the ordinary
way: ``run_ordinary`` (``Group._run``), or ``queue``: the engine's queue, deferred.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from ..algorithms.base import Ctx, OneRound, Plan
from ..errors import CommTimeoutError, GroupAbortedError
from ..trace import recorder
from .group import _failing, inside
from .work import Work

if TYPE_CHECKING:
    from .group import Group

_monotonic = time.monotonic
_begin = recorder.begin
_done = recorder.done


class Bound:
    """One persistent call's runs (see the module docstring).

    Attributes:
        parked: a run was posted (``post``) and its rest has not run yet.
        error: the error the parked run's rest raised, until ``wait`` raises it.
    """

    __slots__ = ("_group", "_plan", "_args", "one", "_engine", "_ctx", "_expected", "_index", "_in_slot",
                 "parked", "error")

    def __init__(self, group: Group, plan: Plan, args: tuple[Any, ...]) -> None:
        self._group, self._plan, self._args = group, plan, args
        one = None if plan.bind is None else plan.bind(plan, *args)
        self.one = one  # the bound round, or None: every run goes the ordinary way
        its = inside(group)
        self._engine = its.engine  # replaced only in a forked child, which drops the round
        self._ctx = ctx = Ctx.of(its.team(), 0, plan)  # the runs' own: its step set per run
        # A round's waits start their clock when they must wait (``Slots._block``); a round that
        # finds its peers there reads no clock for it. Rounds that go on set it (``_go_on``).
        ctx.deadline = math.inf
        self._expected = (None if one is None or one.extents is None  # what its members must announce
                          else one.domain.slots.extent_checks(one.extents))
        self._index = -1  # the running call's flight record
        self._in_slot = 0  # the running call's IN slot
        self.parked = False
        self.error: BaseException | None = None

    def drop(self) -> None:
        """Let go of the bound round (it holds views of the group's shared memory): later runs go
        the ordinary way."""
        self.one = None

    def run_ordinary(self) -> None:
        """Run the call now the ordinary way (``Group._run``), when ``run_round`` cannot."""
        inside(self._group).now(self._plan, self._args)

    def run_round(self) -> bool:
        """Run the bound round now and return True, or return False at once, having done nothing,
        where the ordinary path must run the call (see the module docstring)."""
        one = self.one
        if one is None:
            return False
        engine = self._engine
        seq = engine.enter()
        if seq < 0:
            return False
        # ``post`` and ``finish`` in one frame, the slots' announce and meet in one call
        # (``Slots.start``): request()'s path, four Python calls fewer; test_bound.py runs both
        ctx, plan = self._ctx, self._plan
        try:
            self._group._last_plan = plan  # what ``last_call`` says
            ctx.seq = seq
            index = _begin(ctx.team, plan, seq)
            try:
                d = one.domain
                in_slot = d.next_round()
                for step in one.put[in_slot]:
                    step()
                if d.slots.start(ctx, one.extent, self._expected):  # an extent not as bound
                    one.verify(ctx)  # type: ignore[misc]  # given with extents
                if one.finish is not None:
                    self._go_on(one, in_slot)
                else:
                    for step in one.take[in_slot]:
                        step()
            except BaseException as exc:
                cause = _failing(ctx, exc, index)
                if cause is exc:
                    raise
                raise cause from exc
            if index >= 0:
                _done(index)
        finally:
            engine.leave()
        return True

    def post(self) -> bool:
        """Post this member's part of a run and return True, its rest parked on the engine
        (``finish``), or run at once where every peer's part has arrived (its error, if any,
        kept for ``wait``); or return False at once, having done nothing, where it cannot (then
        ``queue`` the run)."""
        one = self.one
        if one is None:
            return False
        engine = self._engine
        seq = engine.enter()
        if seq < 0:
            return False
        ctx, plan = self._ctx, self._plan
        self._group._last_plan = plan  # what ``last_call`` says
        ctx.seq = seq
        self._index = index = _begin(ctx.team, plan, seq)
        try:
            d = one.domain
            self._in_slot = in_slot = d.next_round()
            for step in one.put[in_slot]:
                step()
            slots = d.slots
            slots.announce(ctx, one.extent)
        except BaseException as exc:
            engine.leave()
            cause = _failing(ctx, exc, index)
            if cause is exc:
                raise
            raise cause from exc
        if self._ready(one):  # the rest now, as MPI_Start progresses
            try:
                self.finish()  # its error waits for ``wait``
            finally:
                engine.leave()
            return True
        self.parked = True
        engine.park(self, watched=one.finish is not None)  # peers may need its later rounds
        return True

    def finish(self) -> None:
        """Run the rest of the parked run (the engine calls it, holding the group's turn); its
        error goes to ``error``. ``parked`` turns False last: a ``wait`` on another thread that
        finds it False may read the outputs (and ``error``) at once."""
        ctx, one = self._ctx, self.one
        try:
            if one is None:  # dropped while parked: the group stopped under it
                raise self._engine.stopped or GroupAbortedError(f"{self._plan.label}: group stopped")
            try:
                slots = one.domain.slots
                slots.meet(ctx)
                expected = self._expected
                if expected is not None and slots.extents_differ(ctx, expected):
                    one.verify(ctx)  # type: ignore[misc]  # given with extents
                if one.finish is not None:
                    self._go_on(one, self._in_slot)
                else:
                    for step in one.take[self._in_slot]:
                        step()
            except BaseException as exc:
                cause = _failing(ctx, exc, self._index)
                if cause is exc:
                    raise
                raise cause from exc
        except BaseException as exc:  # noqa: BLE001 - raised by wait(), on the request's thread
            self.error = exc
        else:
            if self._index >= 0:
                _done(self._index)
        finally:
            self.parked = False

    def wait(self, timeout: float | None = None) -> None:
        """Return once the posted run has finished, running its rest here if nothing has yet.

        Raises:
            CommTimeoutError: not finished within ``timeout`` (the run stays posted).
            CommError: the run failed, or the group stopped before it finished.
        """
        if self.parked:
            engine = self._engine
            if timeout is not None:
                self._arrival(timeout)
            if not engine.settle(self, -1 if timeout is None else timeout):
                raise self._late(timeout)
            if self.parked:  # the engine stopped and dropped it
                self.parked = False
                raise engine.stopped or GroupAbortedError(f"{self._plan.label}: the group stopped")
        error = self.error
        if error is not None:
            self.error = None
            raise error

    def test(self) -> bool:
        """Whether the posted run has finished (its error, if any, still to raise: ``wait``),
        finishing it here when every peer's part has arrived."""
        if self.parked:
            one, engine = self.one, self._engine
            if engine.stopped is not None:
                return True
            if one is not None and self._ready(one):
                engine.settle(self, 0)
        return not self.parked

    def queue(self) -> Work:
        """A run issued in the group's order and deferred (``Engine.submit``): it goes ahead when
        its waiter waits, at the group's next call, or on the group's worker soon after."""
        return inside(self._group).queue(self._plan, self._args)

    def _arrival(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for every peer's part of the posted run."""
        one = self.one
        if one is None:
            return
        slots = one.domain.slots
        end = _monotonic() + timeout
        while not slots.arrived():
            if _monotonic() >= end:
                raise self._late(timeout)
            time.sleep(0.0001)

    def _ready(self, one: OneRound) -> bool:
        """Whether every peer's part of the posted run is there and its rest waits for nobody
        (the first round was the whole call: ``OneRound.whole``)."""
        return one.domain.slots.arrived() and (one.whole is None or one.whole(self._ctx, self._in_slot))

    def _go_on(self, one: OneRound, in_slot: int) -> None:
        """The algorithm's rest of the call after its first round (``OneRound.finish``), which
        may go on with more rounds: they keep the call's clock."""
        ctx = self._ctx
        ctx.deadline = _monotonic() + ctx.team.timeout
        try:
            one.finish(ctx, in_slot)  # type: ignore[misc]  # called where given
        finally:
            ctx.deadline = math.inf

    def _late(self, timeout: float | None) -> CommTimeoutError:
        return CommTimeoutError(f"{self._plan.label} did not complete within {timeout:g} s")
