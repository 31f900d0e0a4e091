"""Same-host all-reduce and reduce: members read each other's slots in place.

Every member copies its terms into its own IN slot; the same slot of every member is one strided
``(members, k)`` array (``ShmDomain.stacked``), so a member reduces all terms with one numpy call
(``shm_common.reduce_rows``), in member order, whatever the number of members.

``direct`` serves contributions that fit one IN slot: each member copies its array into its slot
(alternating between its two slots from call to call, so no closing barrier is needed), waits for
every peer's copy, and reduces all slots straight into its own array: one post and one wait per
call, and the caller's array is written only once every peer's data is in.

``split`` (up to one slot) cuts the array into one part per member: member ``r`` reduces part
``r`` of every slot into its OUT region, posts, and after every peer has posted copies all the
reduced parts out. ``pipelined`` does the same chunk by chunk, for anything larger, with bounded
memory; the next chunk's copy-in overlaps the peers' reductions. Each part is reduced by one
member and copied by the others, so every member ends with the same bits.

All follow ``kernels``' accumulation rule (half precision combines in float32, PREMUL_SUM
premultiplies each term, AVG divides once, then one rounding) and write results into the caller's
array only when nothing can fail any more, or under a ``Journal`` that undoes a failed call.
This module must not import ``core``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .base import Ctx, Plan, Team
from .shm_common import Journal, Op, Reduction, load, no_domain, reduce_rows

# Bytes of one pipelined chunk (at most one IN slot). Large enough that the two posts and waits
# per chunk cost little; the benchmark suite is where to tune it.
CHUNK_BYTES = 1 << 20


def _rows(stacked: np.ndarray) -> Any:
    """``stacked`` as ``reduce_rows`` takes it fastest: two members as a pair of rows."""
    return (stacked[0], stacked[1]) if len(stacked) == 2 else stacked


def _part(count: int, size: int, itemsize: int) -> int:
    """Elements of each member's part of ``count``: equal parts, each a whole number of cache
    lines (the last members' parts may be short or empty)."""
    align = max(1, 64 // itemsize)
    each = -(-count // size)
    return max(align, -(-each // align) * align)


def _copy_parts(red: Reduction, out_rows: np.ndarray, part: int, x: np.ndarray) -> None:
    """Copy member q's reduced part (row q of ``out_rows``, in the accumulation dtype) to
    ``x[q * part:]``, for every member at once (two numpy calls)."""
    full, rest = divmod(x.size, part)
    if red.acc == x.dtype:
        x[:full * part].reshape(full, part)[...] = out_rows[:full]
        if rest:
            x[full * part:] = out_rows[full, :rest]
    else:
        np.copyto(x[:full * part].reshape(full, part), out_rows[:full], casting="unsafe")
        if rest:
            np.copyto(x[full * part:], out_rows[full, :rest], casting="unsafe")


def _domain(team: Team, plan: Plan) -> Any:
    if team.shm is None:
        raise no_domain(plan)
    return team.shm


def _reduction(plan: Plan) -> Reduction:
    if plan.reduction is None:
        raise TypeError(f"{plan.label}: a reduction's plan has no reduction descriptor")
    return plan.reduction


@dataclass(frozen=True, slots=True)
class Direct:
    """``direct``'s state for one call shape.

    Attributes:
        d: the group's domain.
        red: the reduction.
        rows: per slot parity, every member's slot as ``reduce_rows`` takes it.
        mine: per slot parity, this member's slot (in the accumulation dtype).
        pair: the ufunc that reduces the two slots of ``rows`` straight into the caller's array
            in one call (two members, terms in the caller's dtype, no average, ``out``
            positional: ``reduce_rows``' two-member case), else None.
    """

    d: Any
    red: Reduction
    rows: tuple[Any, Any]
    mine: tuple[np.ndarray, np.ndarray]
    pair: np.ufunc | None


def prepare_direct(team: Team, plan: Plan, x: np.ndarray, *rest: Any) -> Direct:
    """``direct``'s (and ``reduce_direct``'s) state."""
    d, red = _domain(team, plan), _reduction(plan)
    stacked = [d.stacked(p, red.acc, x.size) for p in (0, 1)]
    pair = red.ufunc if d.size == 2 and red.raw and red.positional and not red.average else None
    return Direct(d, red, (_rows(stacked[0]), _rows(stacked[1])), (stacked[0][d.rank], stacked[1][d.rank]),
                  pair)


def direct(ctx: Ctx, x: np.ndarray, op: Op, root: int | None = None) -> None:
    """Reduce ``x`` (1-D, C-contiguous, at most one slot in the accumulation dtype) in one round.

    Args:
        ctx: the call's group view; ``ctx.team.shm`` is the group's domain.
        x: this member's array; receives the result (on ``root`` only, when given).
        op: the caller's reduction (AVG and PREMUL_SUM included).
        root: the group rank that gets the result (``reduce``), or None for every member.
    """
    s: Direct = ctx.plan.state
    d, red = s.d, s.red
    parity = d.next_round()
    if red.raw:
        s.mine[parity][...] = x
    else:
        load(red, s.mine[parity], x)
    d.start(ctx)  # no extent: nobody reads it for a reduction
    if root is None or root == d.rank:
        pair = s.pair
        if pair is not None:  # ``reduce_rows`` inline: the small-call path
            rows = s.rows[parity]
            pair(rows[0], rows[1], x)
        else:
            reduce_rows(red, s.rows[parity], x)


@dataclass(frozen=True, slots=True)
class Split:
    """``split``'s state for one call shape.

    Attributes:
        d: the group's domain.
        red: the reduction.
        in_acc: ``red`` for results built in the accumulation dtype (this member's part).
        part: elements of each member's part.
        parts: per slot parity, this member's part of every member's slot (``reduce_rows``' form).
        mine: per slot parity, this member's slot.
        outs: every member's OUT region, one reduced part per row.
        my_out: this member's reduced part in its OUT region.
    """

    d: Any
    red: Reduction
    in_acc: Reduction
    part: int
    parts: tuple[Any, Any]
    mine: tuple[np.ndarray, np.ndarray]
    outs: np.ndarray
    my_out: np.ndarray


def prepare_split(team: Team, plan: Plan, x: np.ndarray, *rest: Any) -> Split:
    """``split``'s (and ``reduce_split``'s) state."""
    d, red = _domain(team, plan), _reduction(plan)
    part = _part(x.size, d.size, red.acc.itemsize)
    a, b = min(d.rank * part, x.size), min((d.rank + 1) * part, x.size)
    stacked = [d.stacked(p, red.acc, x.size) for p in (0, 1)]
    outs = d.stacked(0, red.acc, part, region="out")
    return Split(d, red, red._replace(in_acc=True), part,
                 (_rows(stacked[0][:, a:b]), _rows(stacked[1][:, a:b])),
                 (stacked[0][d.rank], stacked[1][d.rank]), outs, outs[d.rank, :b - a])


def split(ctx: Ctx, x: np.ndarray, op: Op, root: int | None = None) -> None:
    """Reduce ``x`` (at most one slot in the accumulation dtype) with each member reducing one part.

    Two waits: every member copies ``x`` into its IN slot and posts; member ``r`` reduces part
    ``r`` of every slot into its OUT region and posts; then everyone copies every part out of
    the OUT regions. Compared with ``direct`` it moves about the same bytes but does ``1/n`` of
    the arithmetic: better from a few tens of KiB up. ``x`` is written only after the last
    wait. Arguments as ``direct``.
    """
    s: Split = ctx.plan.state
    d = s.d
    parity = d.next_round()
    load(s.red, s.mine[parity], x)
    d.start(ctx)
    reduce_rows(s.in_acc, s.parts[parity], s.my_out)
    d.post()
    d.wait(d.peers, d.posts, ctx)
    if root is None or root == d.rank:
        _copy_parts(s.red, s.outs, s.part, x)


@dataclass(frozen=True, slots=True)
class Pipelined:
    """``pipelined``'s state for one call shape.

    Attributes:
        d: the group's domain.
        red: the reduction.
        in_acc: ``red`` for results built in the accumulation dtype (this member's parts).
        chunk: elements of one chunk.
        part: elements of each member's part of a chunk.
        chunks: the number of chunks (at least one).
        staged: every reduced part of the call fits the OUT regions (copied out at the end).
    """

    d: Any
    red: Reduction
    in_acc: Reduction
    chunk: int
    part: int
    chunks: int
    staged: bool


def prepare_pipelined(team: Team, plan: Plan, x: np.ndarray, *rest: Any) -> Pipelined:
    """``pipelined``'s (and ``reduce_pipelined``'s) state."""
    d, red = _domain(team, plan), _reduction(plan)
    chunk = min(d.slot_bytes, CHUNK_BYTES) // red.acc.itemsize
    part = _part(chunk, d.size, red.acc.itemsize)
    chunks = max(1, -(-x.size // chunk))
    return Pipelined(d, red, red._replace(in_acc=True), chunk, part, chunks,
                     chunks * part * red.acc.itemsize <= d.out_bytes)


def pipelined(ctx: Ctx, x: np.ndarray, op: Op, root: int | None = None) -> None:
    """Reduce ``x`` chunk by chunk through the slots; arguments as ``direct``, any size.

    Per chunk ``j`` every member posts twice: A(j) once its copy-in is done, B(j) once its part
    is reduced. Member ``r`` reduces chunk ``j`` after all A(j), posts B(j), copies chunk ``j+1``
    in and posts A(j+1), then copies chunk ``j`` out after all B(j). A member fills IN slot
    ``j % 2`` again only after all A(j+1), which peers post after reducing chunk ``j``; the same
    argument holds for the two OUT slots. When every member's reduced parts fit its OUT region
    they all stay there and are copied out at the end, after the last wait (nothing can fail
    then); otherwise each chunk is copied out as soon as it is complete, under a ``Journal``.
    """
    s: Pipelined = ctx.plan.state
    d, red, in_acc, chunk, part, chunks, staged = s.d, s.red, s.in_acc, s.chunk, s.part, s.chunks, s.staged
    r = d.rank
    acc, itemsize = red.acc, red.acc.itemsize
    writes = root is None or root == r
    journal = Journal(d, [x]) if writes and not staged else None
    base, peers, mine = d.posts, d.peers, d.inbox[r]
    parities = []

    def piece(j: int) -> np.ndarray:
        return x[j * chunk:(j + 1) * chunk]

    def copy_in(j: int) -> None:
        parities.append(d.next_round())
        load(red, mine[parities[j]][:piece(j).size * itemsize].view(acc), piece(j))

    def out_rows(j: int) -> np.ndarray:
        return d.stacked(0, acc, part, offset=(j if staged else j & 1) * part * itemsize, region="out")

    def reduce_own(j: int) -> None:
        length = piece(j).size
        a, b = min(r * part, length), min((r + 1) * part, length)
        rows = d.stacked(parities[j], acc, length)[:, a:b]
        reduce_rows(in_acc, _rows(rows), out_rows(j)[r, :b - a])

    def copy_out(j: int) -> None:
        lo = j * chunk
        if journal is not None:
            journal.save(0, lo * x.itemsize, (lo + piece(j).size) * x.itemsize)
        _copy_parts(red, out_rows(j), part, piece(j))

    copy_in(0)
    d.start(ctx)
    try:
        for j in range(chunks):
            if j:
                d.wait(peers, base + 2 * j + 1, ctx)  # A(j)
            reduce_own(j)
            d.post()  # B(j)
            if j + 1 < chunks:
                copy_in(j + 1)
                d.post()  # A(j + 1)
            if journal is not None:
                d.wait(peers, base + 2 * j + 2, ctx)  # B(j)
                copy_out(j)
        d.wait(peers, base + 2 * chunks, ctx)  # B(last): peers are done with this member's slots
    except BaseException:
        if journal is not None:
            journal.restore()
        raise
    if staged and writes:
        for j in range(chunks):
            copy_out(j)


def reduce_direct(ctx: Ctx, x: np.ndarray, root: int, op: Op) -> None:
    """``reduce`` onto group rank ``root`` in one round (see ``direct``)."""
    direct(ctx, x, op, root)


def reduce_split(ctx: Ctx, x: np.ndarray, root: int, op: Op) -> None:
    """``reduce`` onto group rank ``root``, each member reducing one part (see ``split``)."""
    split(ctx, x, op, root)


def reduce_pipelined(ctx: Ctx, x: np.ndarray, root: int, op: Op) -> None:
    """``reduce`` onto group rank ``root`` through the pipeline (see ``pipelined``)."""
    pipelined(ctx, x, op, root)
