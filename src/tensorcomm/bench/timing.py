"""How one size is timed on every rank: warm-up, agreed iteration counts, barriers, batches.

The rules, in the order they run:

1. Fresh inputs; with checking on, one call and a count of the wrong elements (summed across
   ranks).
2. One probe call, timed; the ranks agree on the slowest probe. Warm-up then runs ``--warmup``
   calls, or by default as many as fill a fifth of the time budget (1 to ``MAX_WARMUP``).
3. The per-call time of the warm-up (slowest rank) sets the timed calls: ``--iters``, or by
   default as many as fill the time budget (``MIN_ITERS`` to ``MAX_ITERS``). They run in up to
   ``MAX_BATCHES`` batches of equal length, each after a barrier, so a batch of small messages is
   long enough that the barrier's exit skew between ranks does not show. With ``Plan.each``
   (``--barrier each``, the OSU convention) every call of the warm-up and of the batches comes
   after a barrier of its own and is timed alone (the barrier left out), so a root or sender
   that returns early does not run ahead into the next call, as in a program that computes
   between collectives; the counts then come from a call's time with its barrier.
4. Each rank records the per-call time of every batch; the ranks' maxima per batch are the
   batch times (a collective is done when its last rank is), and the row reports their median,
   minimum and maximum.

Every count is agreed across ranks *before* it is used (through the coordinator), so all ranks
always make the same number of calls. Nothing here knows a library: a peer provides the ``Case``
(one call of the collective) and the barrier; the coordinator reduces across ranks.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

WARMUP_SHARE = 0.2  # of the time budget spent warming up by default
MAX_WARMUP = 1000
MIN_ITERS = 5  # a median of fewer batches says little
MAX_ITERS = 1_000_000
MAX_BATCHES = 20


class Case(Protocol):
    """One collective at one size on one rank, with its buffers allocated."""

    def reset(self) -> None:
        """Write fresh input data (the pattern of ``check.fill_input``)."""

    def run(self) -> object:
        """Make one call of the collective (what it returns is not used)."""

    def finish(self) -> None:
        """Wait until every call made so far has completed (for libraries that queue calls)."""

    def wrong(self) -> int:
        """Count this rank's wrong result elements after a call on fresh inputs."""

    def algorithm(self) -> str:
        """What ran the calls, where the library says; "" where it does not."""


class Coordinator(Protocol):
    """Element-wise reductions of small float lists across the ranks of one job."""

    def reduce(self, values: Sequence[float], op: str) -> list[float]:
        """Every rank gets the element-wise ``"max"`` or ``"sum"`` of all ranks' ``values``."""


@dataclass(frozen=True)
class Plan:
    """How to time one size: fixed counts where given, else counts from the time budget."""

    budget: float  # seconds of timed calls per size
    warmup: int | None = None
    iters: int | None = None
    check: bool = True
    each: bool = False  # a barrier before each timed call (OSU), not one per batch


@dataclass(frozen=True)
class Measurement:
    """The outcome of timing one size, identical on every rank."""

    batch_times: list[float]  # seconds per call, slowest rank, one per batch
    iters: int
    warmup: int
    wrong: int | None  # None: not checked

    @property
    def median(self) -> float:
        """Median seconds per call across batches."""
        return statistics.median(self.batch_times)


def warmup_calls(probe: float, plan: Plan) -> int:
    """Warm-up calls: ``plan.warmup``, or a fifth of the budget at ``probe`` seconds a call."""
    if plan.warmup is not None:
        return plan.warmup
    return _clamp(WARMUP_SHARE * plan.budget / probe if probe > 0 else MAX_WARMUP, 1, MAX_WARMUP)


def batches(per_call: float, plan: Plan) -> tuple[int, int]:
    """``(batches, calls per batch)`` for the timed calls at ``per_call`` seconds a call.

    The total is ``plan.iters`` when given, else what fills ``plan.budget``.
    """
    total = plan.iters if plan.iters is not None else _clamp(
        plan.budget / per_call if per_call > 0 else MAX_ITERS, MIN_ITERS, MAX_ITERS)
    count = min(total, MAX_BATCHES)
    return count, max(1, total // count)


def _clamp(value: float, low: int, high: int) -> int:
    return max(low, min(high, int(value)))


def _timed(case: Case, calls: int, clock: Callable[[], float]) -> float:
    """Seconds for ``calls`` calls, completion included."""
    run = case.run
    start = clock()
    for _ in range(calls):
        run()
    case.finish()
    return clock() - start


def _timed_each(case: Case, calls: int, barrier: Callable[[], None],
                clock: Callable[[], float]) -> tuple[float, float]:
    """Seconds for ``calls`` calls, each after a barrier and timed alone (completion included),
    and the seconds they took with their barriers."""
    run, finish = case.run, case.finish
    total = 0.0
    began = clock()
    for _ in range(calls):
        barrier()
        start = clock()
        run()
        finish()
        total += clock() - start
    return total, clock() - began


def measure(case: Case, barrier: Callable[[], None], coordinator: Coordinator, plan: Plan,
            clock: Callable[[], float] = time.perf_counter) -> Measurement:
    """Time ``case`` by the rules of the module docstring; every rank returns the same result."""
    wrong = None
    case.reset()  # also without a check: real data, and every page touched before timing
    if plan.check:
        case.run()
        case.finish()
        wrong = int(coordinator.reduce([case.wrong()], "sum")[0])
    barrier()
    probe = coordinator.reduce([_timed(case, 1, clock)], "max")[0]
    warm = warmup_calls(probe, plan)
    barrier()
    if plan.each:  # the budget pays for the barriers too
        warmed = _timed_each(case, warm, barrier, clock)[1] if warm else probe
    else:
        warmed = _timed(case, warm, clock) if warm else probe
    per_call = coordinator.reduce([warmed / warm if warm else probe], "max")[0]
    count, calls = batches(per_call, plan)
    mine = []
    for _ in range(count):
        barrier()
        mine.append((_timed_each(case, calls, barrier, clock)[0] if plan.each else
                     _timed(case, calls, clock)) / calls)
    return Measurement(batch_times=coordinator.reduce(mine, "max"), iters=count * calls, warmup=warm,
                       wrong=wrong)
