"""Selection that learns: which of a large call's shared-memory algorithms runs, measured on the
job's own calls.

Which algorithm is fastest for a call depends on things ``select``'s fixed rules and the tuning
file cannot see: whether the program calls one collective at a time or back to back, and how fast
the host's cores pass data to each other right now (on the project's VM that rate moves by 2-10x
for hours at a time). So for every call shape of at least ``LEARN_BYTES`` on a group with a
shared-memory domain, where more than one shared-memory algorithm can run it (slots or direct
reads; for all_reduce also one round or split), the group keeps a ``Learner`` per signature:

- The starting choice (the *incumbent*) is ``select.pick``'s: the tuning file's, else the
  built-in rules'.
- Exploration: in every ``PERIOD`` calls of the shape, each other candidate runs
  ``TRIAL_CALLS`` calls in a row from call ``PERIOD // 2`` on; the last of them is timed (the
  first pays for the switch). A candidate that lost by more than ``BACKOFF_RATIO`` is tried
  half as often each time it loses again (down to once in ``2 ** MAX_BACKOFF`` periods), so
  at most ``TRIAL_CALLS`` calls per candidate in ``PERIOD`` (6 %) run something else, and
  fewer once the choice is clear.
- One member decides: the *decider* (group rank 0, or the member after the root for rooted
  calls, whose own time a root would not show). It times the ``SAMPLES`` calls before the
  trials and each trial's last call (``time.perf_counter`` around the algorithm), keeps the last
  ``SAMPLES`` times per candidate and, at the start of every period, makes the candidate with
  the least median time the incumbent if it beats the incumbent's median by more than
  ``MARGIN``.
- Agreement without an extra round: the decider appends each change to a log in its line of
  the segment's control area (``Slots.publish``) before its call, effective from the shape's
  next call. Every member reads the decider's log at the start of each learned call
  (``Slots.published``) and applies a record when its count of the shape's calls reaches the
  record's. A member that makes the shape's next call has met the decider's first post of the
  call before it (every shared-memory algorithm starts so), which the decider made after writing
  the record: so every member switches at the same call. Members count calls per signature, which
  the members' announcements check at every call, so the counts agree.

Members learn only if every member of the group allows it (``TENSORCOMM_LEARN``, settled when the
group starts: ``ShmDomain.settle``). Persistent requests and TCP groups keep the fixed choice.
``Work.algorithm``, ``Group.last_call()`` and the flight recorder name the algorithm that ran.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any

from ..signature import NO_ROOT, Signature
from .base import Ctx, Plan, Row, Team, make_plan

LEARN_BYTES = 256 << 10  # smaller calls keep the fixed choice: learning's 0.3-0.6 us a call would show
PERIOD = 64  # calls of a shape between two decisions
TRIAL_CALLS = 2  # calls in a row an exploration runs a candidate; the last is timed
SAMPLES = 7  # recent times kept per candidate
MIN_SAMPLES = 2  # times a candidate needs before it counts in a decision
MARGIN = 0.05  # a candidate replaces the incumbent only if its median is this much less
BACKOFF_RATIO = 1.3  # a candidate this much slower than the incumbent is tried less often
MAX_BACKOFF = 6  # tried at least once in 2 ** MAX_BACKOFF periods
MAX_SHAPES = 64  # signatures a group learns for; later ones keep the fixed choice
# Collectives whose signature fixes every member's size (all_to_all's does not: members may send
# different amounts, so they could see different candidates), with more than one shared-memory row.
LEARNED = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter")
_BITS = 4  # per candidate in a record's choice word: the incumbent, then each backoff


class Board:
    """A group's learners, by signature, and how far this member has read each decider's log.

    Args:
        slots: the group's control area (``transports.shm.slots.Slots``): ``publish``,
            ``published`` and ``log_head_word``, its ``words`` and the members' ``rank`` and
            ``size``.
    """

    def __init__(self, slots: Any) -> None:
        self.slots = slots
        self.words = slots.words
        self.heads = tuple(slots.log_head_word(q) for q in range(slots.size))  # word of each log's head
        self.seen = [0] * slots.size  # records read of each member's log
        self.learners: dict[Signature, Learner] = {}
        self._early: dict[int, list[tuple[int, ...]]] = {}  # records for learners not made yet

    def learner(self, signature: Signature, names: Sequence[str], incumbent: int) -> Learner | None:
        """The learner of ``signature`` (made on its first plan: every member makes them in the
        same order, the calls' own), or None once ``MAX_SHAPES`` are learning."""
        learner = self.learners.get(signature)
        if learner is None and len(self.learners) < MAX_SHAPES:
            root = signature.root
            decider = 0 if root == NO_ROOT else (root + 1) % self.slots.size
            learner = Learner(self, hash(signature), tuple(names), incumbent, decider)
            self.learners[signature] = learner
            for record in self._early.pop(learner.token, ()):
                learner.pending.append(record)
        return learner

    def read(self, decider: int) -> None:
        """Hand the records ``decider`` appended since the last read to their learners."""
        records = self.slots.published(decider, self.seen[decider])
        self.seen[decider] += len(records)
        by_token = {learner.token: learner for learner in self.learners.values()}
        for record in records:
            learner = by_token.get(record[0])
            if learner is None:
                self._early.setdefault(record[0], []).append(record)
            else:
                learner.pending.append(record)


TRIAL_FROM = PERIOD // 2  # the offset in a period of the first trial


class Learner:
    """Which candidate runs each call of one signature, and (on the decider) what they took."""

    def __init__(self, board: Board, token: int, names: tuple[str, ...], incumbent: int,
                 decider: int) -> None:
        self.board = board
        self.token = token
        self.names = names
        self.incumbent = incumbent
        self.backoff = [0] * len(names)
        self.decider = decider
        self.deciding = board.slots.rank == decider
        self.count = 0  # calls of the signature so far
        self.pending: deque[tuple[int, ...]] = deque()  # (token, from call, choice), in order
        self.samples = [deque[float](maxlen=SAMPLES) for _ in names]
        self.timed = False  # whether the call running now is timed (set by ``pick``)
        self.last = incumbent  # the candidate of the latest call
        self._trials_end = TRIAL_FROM + TRIAL_CALLS * (len(names) - 1)  # offset after the trials

    def pick(self) -> int:
        """The candidate that runs this call (every member gets the same)."""
        board, decider = self.board, self.decider
        if board.words[board.heads[decider]] != board.seen[decider]:
            board.read(decider)
        call = self.count
        self.count = call + 1
        pending = self.pending
        while pending and pending[0][1] <= call:
            self._apply(pending.popleft()[2])
        offset = call % PERIOD
        if offset < TRIAL_FROM or offset >= self._trials_end:
            if not offset and call and self.deciding:
                self._decide(call)
            chosen = self.incumbent
            self.timed = TRIAL_FROM - SAMPLES <= offset < TRIAL_FROM  # the calls before the trials
        else:
            chosen, self.timed = self._trial(call // PERIOD, offset - TRIAL_FROM)
        self.last = chosen
        return chosen

    def _trial(self, period: int, into: int) -> tuple[int, bool]:
        """The candidate ``into`` calls into the trials of period ``period``, and whether its
        time counts (the last call of a trial)."""
        trial, within = divmod(into, TRIAL_CALLS)
        other = trial + (trial >= self.incumbent)  # the trial-th candidate but the incumbent
        if period % (1 << self.backoff[other]):
            return self.incumbent, False
        return other, within == TRIAL_CALLS - 1

    def _decide(self, call: int) -> None:
        """Publish a new incumbent or backoff, effective from call ``call + 1``, if the times
        say so."""
        medians = [statistics.median(s) if len(s) >= MIN_SAMPLES else None for s in self.samples]
        current = medians[self.incumbent]
        if current is None:
            return
        best = min((m, i) for i, m in enumerate(medians) if m is not None)[1]
        chosen = best if medians[best] < current * (1 - MARGIN) else self.incumbent  # type: ignore[operator]
        floor = medians[chosen]
        backoff = list(self.backoff)
        for i, median in enumerate(medians):
            if i != chosen and median is not None:
                backoff[i] = min(backoff[i] + 1, MAX_BACKOFF) if median > floor * BACKOFF_RATIO else 0  # type: ignore[operator]
        if chosen != self.incumbent or backoff != self.backoff:
            word = chosen | sum(b << (_BITS * (i + 1)) for i, b in enumerate(backoff))
            self.board.slots.publish((self.token, call + 1, word))

    def _apply(self, word: int) -> None:
        mask = (1 << _BITS) - 1
        self.incumbent = word & mask
        self.backoff = [(word >> (_BITS * (i + 1))) & mask for i in range(len(self.names))]


class Choices:
    """One call shape's plans, one per candidate, and the learner that picks among them
    (``Plan.choices``; the core runs ``choose()``'s plan)."""

    __slots__ = ("learner", "plans")

    def __init__(self, learner: Learner, plans: Sequence[Plan]) -> None:
        self.learner = learner
        self.plans = tuple(plans)

    def choose(self) -> Plan:
        """The plan that runs this call."""
        return self.plans[self.learner.pick()]

    def settled(self) -> str:
        """The algorithm the shape runs outside trials now (the incumbent's)."""
        learner = self.learner
        return learner.names[learner.incumbent]

    def drop(self) -> None:
        """Let go of the candidates' state (views of the group's shared memory)."""
        for plan in self.plans:
            plan.state = None


def candidates(collective: str, team: Team, nbytes: int, chosen: Row,
               fits: Callable[[str, str, Team, int], bool], rows: Sequence[Row]) -> list[Row]:
    """The rows learning chooses among for a call: the shared-memory rows of ``collective``
    (``rows``, in table order) that ``fits`` the call, when there are two or more, the call is
    at least ``LEARN_BYTES`` and the group learns (``team.learning``); else none."""
    if team.learning is None or nbytes < LEARN_BYTES or collective not in LEARNED \
            or not chosen.name.startswith("shm_"):
        return []
    found = [row for row in rows if row.name.startswith("shm_") and fits(collective, row.name, team, nbytes)]
    return found if len(found) > 1 and chosen in found else []


def learned_plan(rows: Sequence[Row], chosen: Row, label: str, signature: Signature, team: Team,
                 args: Sequence[Any], op: Any = None, reduction: Any = None) -> Plan:
    """The plan of a call shape that learns among ``rows`` (``candidates``), starting from
    ``chosen``: a plan of ``chosen`` whose ``choices`` hold a plan per row, the decider's timed;
    ``chosen``'s alone when the group learns for ``MAX_SHAPES`` signatures already."""
    board: Board = team.learning
    learner = board.learner(signature, [row.name for row in rows], rows.index(chosen))
    if learner is None or learner.names != tuple(row.name for row in rows):
        return make_plan(chosen, label, signature, team, args, op, reduction)
    plans = [make_plan(row, label, signature, team, args, op, reduction) for row in rows]
    if learner.deciding:
        for index, plan in enumerate(plans):
            plan.run = _timed(learner, index, plan.run)
    plan = Plan(label, signature, chosen.name, chosen.fn, op, reduction)  # never run: a candidate runs
    plan.choices = choices = Choices(learner, plans)
    for candidate in plans:
        candidate.learned = choices
    return plan


def _timed(learner: Learner, index: int, run: Callable[..., Any]) -> Callable[..., Any]:
    """``run`` (candidate ``index``'s algorithm), its time kept in ``learner``'s samples when
    the call is timed (``Learner.pick``)."""
    samples = learner.samples[index]

    def timed(ctx: Ctx, *args: Any) -> Any:
        if not learner.timed:
            return run(ctx, *args)
        start = perf_counter()
        result = run(ctx, *args)
        samples.append(perf_counter() - start)
        return result
    return timed
