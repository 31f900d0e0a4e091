"""Same-host broadcast and scatter: one member publishes, the others copy from its slot.

The root publishes its array in its IN slot, one slot per round (``shm_common.run_rounds``) when
it does not fit one; every other member copies its share straight into its array. Broadcast
overwrites the caller's array in place, so a receiver writes it only once the root's whole array
is in shared memory (a failed call leaves it untouched): up to a slot in the root's IN slot, up
to the OUT region (``staged``) there, in one piece, so that each byte is copied twice, at the
speed of one core copying alone; in a run of such broadcasts the root copies a call's array while
the receivers still copy the previous one (``staged`` says how). Larger arrays go round by round,
with a ``Journal`` that keeps the array's old bytes (a third copy). Scatter's output is an output
only, so a failed multi-round scatter may leave it partly written. This module must not import ``core``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .allgather import bounds
from .base import Ctx, OneRound, Plan, Team
from .shm_common import Journal, Stream, bound_copy, copy, domain, run_rounds


@dataclass(frozen=True, slots=True)
class Broadcast:
    """``broadcast``'s state for one call shape.

    Attributes:
        d: the group's domain.
        views: when the array fits one slot, per IN slot the root's slot as a typed view;
            else None.
        staged: the array fits the OUT region (``staged``); else it goes round by round.
    """

    d: Any
    views: tuple[np.ndarray, np.ndarray] | None
    staged: bool


def prepare_broadcast(team: Team, plan: Plan, x: np.ndarray, root: int) -> Broadcast:
    """``broadcast``'s state."""
    d = domain(team, plan)
    views = None
    if x.nbytes <= d.slot_bytes:
        views = (d.inbox[root][0][:x.nbytes].view(x.dtype), d.inbox[root][1][:x.nbytes].view(x.dtype))
    return Broadcast(d, views, x.nbytes <= d.out_bytes)


def broadcast(ctx: Ctx, x: np.ndarray, root: int) -> None:
    """Copy group rank ``root``'s ``x`` into every member's ``x`` (1-D, C-contiguous)."""
    s: Broadcast = ctx.plan.state
    d, views = s.d, s.views
    if views is not None:  # one round, the root's slot read in place
        in_slot = d.next_round()
        if d.rank == root:
            copy(views[in_slot], x)
        d.start(ctx)  # nobody reads extents in one round
        if d.rank != root:
            copy(x, views[in_slot])
        return
    if s.staged:
        staged(ctx, x, root)
        return
    if d.rank == root:
        run_rounds(ctx, Stream.of([x]), lambda in_slot, lo, hi, journal: None)
        return
    raw = x.view(np.uint8)
    source = d.inbox[root]

    def read(in_slot: int, lo: int, hi: int, journal: Journal | None) -> None:
        b = min(hi, raw.size)
        if lo < b:
            if journal is not None:
                journal.save(0, lo, b)
            copy(raw[lo:b], source[in_slot][:b - lo])

    run_rounds(ctx, Stream.of([]), read, [x])


def bind_broadcast(plan: Plan, x: np.ndarray, root: int) -> OneRound | None:
    """``broadcast`` of ``x`` as one bound round (``OneRound``) where it fits the root's slot:
    the root copies ``x`` in, the others copy it out; else None."""
    s: Broadcast = plan.state
    views = s.views
    if views is None:
        return None
    copies = tuple((bound_copy(views[p], x) if s.d.rank == root else bound_copy(x, views[p]),)
                   for p in (0, 1))
    return OneRound(s.d, (copies[0], copies[1]), ((), ())) if s.d.rank == root else \
        OneRound(s.d, ((), ()), (copies[0], copies[1]))


def staged(ctx: Ctx, x: np.ndarray, root: int) -> None:
    """Broadcast through the root's OUT region (``x`` at most that size): the root copies ``x``
    there once every member has started the call (so none still reads the region from an
    earlier call; every algorithm writes OUT only after its first wait) and posts; the others
    copy it out after that post. Two posts per member.

    When the domain's previous call was such a broadcast and both fit half the OUT region, this
    one uses the other half, and the root copies ``x`` there before its first wait: the previous
    call's receivers read only the other half (of their root's region), and every member started
    the previous call after it had finished reading the one before, which used this half. So in
    a run of broadcasts the root fills the next call's half while the receivers still copy out
    the previous call's. A receiver still writes its array only after the root's post that
    follows the whole copy, so a failed call leaves it untouched.
    """
    d = ctx.team.shm
    half_bytes = d.out_bytes // 2 // 64 * 64
    last = d.last_broadcast  # (post count at its end, half): every member counts alike
    ahead = last is not None and last[0] == d.posts and x.nbytes <= half_bytes
    half = 1 - last[1] if ahead and last is not None else 0
    region = d.outbox[root][half * half_bytes:][:x.nbytes]
    is_root = d.rank == root
    d.next_round()
    if ahead and is_root:
        copy(region, x.view(np.uint8))
    d.start(ctx)
    if is_root:
        if not ahead:
            copy(region, x.view(np.uint8))
        d.post()
    else:
        d.post()
        d.wait((root,), d.posts, ctx)
        copy(x.view(np.uint8), region)
    d.last_broadcast = (d.posts, half) if x.nbytes <= half_bytes else None


@dataclass(frozen=True, slots=True)
class Scatter:
    """``scatter``'s state for one call shape.

    Attributes:
        d: the group's domain.
        offsets: element bounds of each member's block of the root's ``send``.
        views: when ``send`` fits one slot, per IN slot the root's slot and this member's
            block of it, typed; else None (rounds).
    """

    d: Any
    offsets: list[int]
    views: tuple[tuple[np.ndarray, np.ndarray], ...] | None


def prepare_scatter(team: Team, plan: Plan, send: Any, out: np.ndarray, counts: Sequence[int],
                    root: int) -> Scatter:
    """``scatter``'s state."""
    d = domain(team, plan)
    r, itemsize = d.rank, out.itemsize
    offsets = bounds(counts)
    views = None
    if offsets[-1] * itemsize <= d.slot_bytes:
        views = tuple((d.inbox[root][p][:offsets[-1] * itemsize].view(out.dtype),
                       d.inbox[root][p][offsets[r] * itemsize:offsets[r + 1] * itemsize].view(out.dtype))
                      for p in (0, 1))
    return Scatter(d, offsets, views)


def scatter(ctx: Ctx, send: np.ndarray | None, out: np.ndarray, counts: Sequence[int], root: int) -> None:
    """Copy block ``i`` of group rank ``root``'s ``send`` into member ``i``'s ``out``.

    Args:
        send: on ``root``, ``sum(counts)`` elements in group-rank order; None elsewhere.
        out: this member's 1-D array of ``counts[ctx.rank]`` elements.
        counts: elements each member receives (the same list on every member).
        root: the group rank that sends.
    """
    s: Scatter = ctx.plan.state
    d, offsets, views = s.d, s.offsets, s.views
    r = d.rank
    itemsize = out.itemsize
    if views is not None:  # one round, the root's slot read in place
        in_slot = d.next_round()
        whole, block = views[in_slot]
        if r == root:
            assert send is not None
            copy(whole, send)
        d.start(ctx)  # nobody reads extents in one round
        copy(out, block)
        return
    if r == root:
        assert send is not None
        run_rounds(ctx, Stream.of([send]), lambda in_slot, lo, hi, journal: None)
        copy(out, send[offsets[root]:offsets[root + 1]])
        return
    start, stop = offsets[r] * itemsize, offsets[r + 1] * itemsize
    raw = out.view(np.uint8)
    source = d.inbox[root]

    def read(in_slot: int, lo: int, hi: int, journal: Journal | None) -> None:
        a, b = max(lo, start), min(hi, stop)
        if a < b:
            copy(raw[a - start:b - start], source[in_slot][a - lo:b - lo])

    run_rounds(ctx, Stream.of([]), read)  # ``out`` is an output only: no journal
