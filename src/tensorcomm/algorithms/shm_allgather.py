"""Same-host all-gather and gather: members copy their peers' slots straight into their outputs.

Every member publishes its array in its IN slot, one slot per round (``shm_common.run_rounds``)
when the call does not fit one. A reader copies each peer's bytes into that peer's block of
``out``, and its own array last, once nothing can fail any more. When every member sends as
many elements and the call fits one slot, all blocks come out of the members' slots with one
numpy call (a strided view of every slot). Contributions may differ in size per member (the "v"
variant); each member checks the sizes its peers announce against the counts it was given.
``out`` is an output only, so a call that fails after its first round may leave it partly
written (no journal: see ``shm_common.Journal``). This module must not import ``core``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ..errors import CollectiveMismatchError
from .allgather import bounds
from .base import Ctx, OneRound, Plan, Team
from .shm_common import Journal, Read, Stream, bound_copy, copy, domain, run_rounds


def _check_sizes(ctx: Ctx, counts: Sequence[int], itemsize: int, senders: Sequence[int],
                 extents: list[int]) -> None:
    d = ctx.team.shm
    for q in senders:
        if extents[q] != counts[q] * itemsize:
            raise CollectiveMismatchError(
                f"rank {d.global_ranks[q]} called {ctx.name} with {extents[q] // itemsize} "
                f"elements, while rank {d.global_ranks[d.rank]} called it expecting "
                f"{counts[q]} from rank {d.global_ranks[q]}, at step {ctx.seq}")


@dataclass(frozen=True, slots=True)
class Gathered:
    """``all_gather``'s and ``gather``'s state for one call shape.

    Attributes:
        d: the group's domain.
        offsets: element bounds of each member's block of the output.
        expected: bytes each member sends (its announced extent).
        slots: when the call fits one slot, per IN slot the members' slots as one strided
            ``(members, count)`` array (equal counts, more than two members) or one view per
            member; else None (rounds).
    """

    d: Any
    offsets: list[int]
    expected: list[int]
    slots: Any


def prepare(team: Team, plan: Plan, send: np.ndarray, out: Any, counts: Sequence[int],
            *rest: Any) -> Gathered:
    """``all_gather``'s (and ``gather``'s) state."""
    d = domain(team, plan)
    dtype = send.dtype
    itemsize, total = dtype.itemsize, sum(counts)
    offsets = bounds(counts)
    expected = [count * itemsize for count in counts]
    if total * itemsize > d.slot_bytes:
        return Gathered(d, offsets, expected, None)
    if len(set(counts)) == 1 and d.size > 2:  # two members: one view each copies with fewer calls
        return Gathered(d, offsets, expected, tuple(d.stacked(p, dtype, counts[0]) for p in (0, 1)))
    return Gathered(d, offsets, expected, tuple(
        tuple(d.inbox[q][p][:counts[q] * itemsize].view(dtype) for q in range(d.size)) for p in (0, 1)))


def _copy_rounds(ctx: Ctx, out: np.ndarray, offsets: Sequence[int], senders: Sequence[int]) -> Read:
    d = ctx.team.shm
    raw = out.view(np.uint8)
    starts = [o * out.itemsize for o in offsets]

    def read(in_slot: int, lo: int, hi: int, journal: Journal | None) -> None:
        for q in senders:
            size = starts[q + 1] - starts[q]
            b = min(hi, size)
            if lo < b:
                copy(raw[starts[q] + lo:starts[q] + b], d.inbox[q][in_slot][:b - lo])

    return read


def _copy_slots(out: np.ndarray, slots: Any, offsets: Sequence[int], skip: int) -> None:
    """Every member's slot (a strided ``(members, count)`` view, or one view per member) into
    its block of ``out``; member ``skip``'s block is left for the caller."""
    if isinstance(slots, np.ndarray):  # two numpy calls: the members before and after skip
        blocks = out.reshape(len(slots), -1)
        blocks[:skip] = slots[:skip]
        blocks[skip + 1:] = slots[skip + 1:]
        return
    for q, slot in enumerate(slots):
        if q != skip:
            copy(out[offsets[q]:offsets[q + 1]], slot)


def all_gather(ctx: Ctx, send: np.ndarray, out: np.ndarray, counts: Sequence[int]) -> None:
    """Every member's ``send`` lands in block ``member`` of ``out`` on every member.

    Args:
        ctx: the call's group view; ``ctx.team.shm`` is the group's domain.
        send: this member's 1-D array (``counts[ctx.rank]`` elements).
        out: 1-D, ``sum(counts)`` elements, blocks in group-rank order.
        counts: elements each member sends.
    """
    s: Gathered = ctx.plan.state
    d, offsets, expected, slots = s.d, s.offsets, s.expected, s.slots
    r = d.rank
    if slots is None:
        run_rounds(ctx, Stream.of([send]), _copy_rounds(ctx, out, offsets, d.peers),
                   verify=lambda in_slot, extents: _check_sizes(ctx, counts, send.itemsize, d.peers, extents))
    elif d.size == 2:  # one view per member: one word to check, one copy out
        in_slot = d.next_round()
        views, q = slots[in_slot], 1 - r
        copy(views[r], send)
        d.start(ctx, send.nbytes)
        if d.extent(q, ctx) != expected[q]:
            _check_sizes(ctx, counts, send.itemsize, d.peers, d.extents(ctx))
        copy(out[offsets[q]:offsets[q + 1]], views[q])
    else:
        in_slot = d.next_round()
        mine = slots[in_slot][r]
        copy(mine, send)
        d.start(ctx, send.nbytes)
        extents = d.extents(ctx)
        if extents != expected:
            _check_sizes(ctx, counts, send.itemsize, d.peers, extents)
        _copy_slots(out, slots[in_slot], offsets, r)
    copy(out[offsets[r]:offsets[r + 1]], send)


def bind_all_gather(plan: Plan, send: np.ndarray, out: np.ndarray, counts: Sequence[int]) -> OneRound | None:
    """``all_gather`` as one bound round (``OneRound``) where every block fits one slot: the
    same copy into the slot, the same extents checked, the same copies out (this member's own
    block last); else None."""
    s: Gathered = plan.state
    d, offsets, slots = s.d, s.offsets, s.slots
    if slots is None:
        return None
    r = d.rank
    own = bound_copy(out[offsets[r]:offsets[r + 1]], send)
    put, take = [], []
    for p in (0, 1):
        put.append((bound_copy(slots[p][r], send),))
        if d.size == 2:
            q = 1 - r
            take.append((bound_copy(out[offsets[q]:offsets[q + 1]], slots[p][q]), own))
        else:
            take.append((partial(_copy_slots, out, slots[p], offsets, r), own))

    def verify(ctx: Ctx) -> None:
        _check_sizes(ctx, counts, send.itemsize, d.peers, d.extents(ctx))

    return OneRound(d, (put[0], put[1]), (take[0], take[1]), send.nbytes, tuple(s.expected), verify)


def gather(ctx: Ctx, send: np.ndarray, out: np.ndarray | None, counts: Sequence[int], root: int) -> None:
    """Every member's ``send`` lands in block ``member`` of ``out`` on group rank ``root`` only.

    Args:
        out: on ``root``, ``sum(counts)`` elements; None elsewhere.
        counts: elements each member sends.
        root: the group rank that receives.
    """
    s: Gathered = ctx.plan.state
    d, offsets, expected, slots = s.d, s.offsets, s.expected, s.slots
    r = d.rank
    if slots is None:
        if r != root:
            run_rounds(ctx, Stream.of([send]), lambda in_slot, lo, hi, journal: None)
            return
        assert out is not None
        run_rounds(ctx, Stream.of([send], skip=0), _copy_rounds(ctx, out, offsets, d.peers),
                   verify=lambda in_slot, extents: _check_sizes(ctx, counts, send.itemsize, d.peers, extents))
    else:
        in_slot = d.next_round()
        if r != root:
            copy(slots[in_slot][r], send)
        d.start(ctx, send.nbytes)
        if r != root:
            return
        assert out is not None
        extents = d.extents(ctx)
        extents[root] = expected[root]  # the root sends nothing
        if extents != expected:
            _check_sizes(ctx, counts, send.itemsize, d.peers, extents)
        _copy_slots(out, slots[in_slot], offsets, root)
    copy(out[offsets[root]:offsets[root + 1]], send)
