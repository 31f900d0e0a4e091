"""Same-host all-reduce and reduce: members read each other's slots in place.

Every member copies its terms into its own IN slot; the same slot of every member is one strided
``(members, k)`` array (``ShmDomain.stacked``), so a member reduces all terms with one numpy call
(``shm_common.reduce_terms``), in member order, whatever the number of members.

``direct`` serves contributions that fit one IN slot: each member copies its array into its slot
(alternating between its two slots from call to call, so no closing barrier is needed), waits for
every peer's copy, and reduces all slots straight into its own array: one post and one wait per
call, and the caller's array is written only once every peer's data is in.

``split`` (up to one slot) cuts the array into one part per member: member ``r`` reduces part
``r`` of every slot into its OUT region, posts, and after every peer has posted copies all the
reduced parts out. ``pipelined`` does the same chunk by chunk, for anything larger, with bounded
memory; the next chunk's copy-in overlaps the peers' reductions. Each part is reduced by one
member and copied by the others, so every member ends with the same bits. With two members and
terms that are the caller's bytes (``Reduction.raw``) a member publishes only its peer's part and
reduces its own part straight from its array (``Pair``): per byte of the array it copies half a
byte fewer (docs/algorithms.md counts them).

All follow ``kernels``' accumulation rule (half precision combines in float32, PREMUL_SUM
premultiplies each term, AVG divides once, then one rounding) and write results into the caller's
array only when nothing can fail any more, or under a ``Journal`` that undoes a failed call.
This module must not import ``core``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from .base import Ctx, OneRound, Plan, Team
from .shm_common import Journal, Op, Reduction, bound_copy, copy, load, no_domain, part_size, reduce_terms

# Bytes of one pipelined chunk (at most one IN slot; through the OUT regions, chunks of one size
# near it). Large enough that the two posts and waits per chunk cost little; the benchmark suite
# is where to tune it.
CHUNK_BYTES = 1 << 20
# Chunks an OUT region holds at once in ``_through_out`` where a failed call may leave the array
# partly written: the region is a ring, so a call of any size stays in the caches.
RING = 3
# Where the group keeps arrays untouched or complete, ``_through_out`` runs through the rings
# (saving each chunk of the array first) from this size on; below, the array and its reduced
# parts staged whole in the OUT regions stay in the caches and cost less than the saved copy
# (same ranks alternating, load 1: 8 MiB 717 vs 1093 us, 16 MiB 2806 vs 2534, 32 MiB 5615 vs 5130).
KEEP_GOING_RING_BYTES = 16 << 20


def _terms_of(stacked: np.ndarray) -> Any:
    """Every member's terms (``stacked``) as ``reduce_terms`` takes them fastest: two members as
    a pair of arrays."""
    return (stacked[0], stacked[1]) if len(stacked) == 2 else stacked


def _copy_parts(red: Reduction, out_parts: np.ndarray, part: int, x: np.ndarray) -> None:
    """Copy member q's reduced part (row q of ``out_parts``, in the accumulation dtype) to
    ``x[q * part:]``, for every member at once (two numpy calls)."""
    full, rest = divmod(x.size, part)
    if red.acc == x.dtype:
        x[:full * part].reshape(full, part)[...] = out_parts[:full]
        if rest:
            x[full * part:] = out_parts[full, :rest]
    else:
        np.copyto(x[:full * part].reshape(full, part), out_parts[:full], casting="unsafe")
        if rest:
            np.copyto(x[full * part:], out_parts[full, :rest], casting="unsafe")


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
        terms: per IN slot, every member's slot as ``reduce_terms`` takes it.
        mine: per IN slot, this member's slot (in the accumulation dtype).
        pair: the ufunc that reduces the two slots of ``terms`` straight into the caller's array
            in one call (two members, terms in the caller's dtype, no average, ``out``
            positional: ``reduce_terms``' two-member case), else None.
    """

    d: Any
    red: Reduction
    terms: tuple[Any, Any]
    mine: tuple[np.ndarray, np.ndarray]
    pair: np.ufunc | None


def prepare_direct(team: Team, plan: Plan, x: np.ndarray, *rest: Any) -> Direct:
    """``direct``'s (and ``reduce_direct``'s) state."""
    d, red = _domain(team, plan), _reduction(plan)
    stacked = [d.stacked(p, red.acc, x.size) for p in (0, 1)]
    pair = red.ufunc if d.size == 2 and red.raw and red.positional and not red.average else None
    return Direct(d, red, (_terms_of(stacked[0]), _terms_of(stacked[1])),
                  (stacked[0][d.rank], stacked[1][d.rank]), pair)


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
    in_slot = d.next_round()
    if red.raw:
        s.mine[in_slot][...] = x
    else:
        load(red, s.mine[in_slot], x)
    d.start(ctx)  # no extent: nobody reads it for a reduction
    if root is None or root == d.rank:
        pair = s.pair
        if pair is not None:  # ``reduce_terms`` inline: the small-call path
            terms = s.terms[in_slot]
            pair(terms[0], terms[1], x)
        else:
            reduce_terms(red, s.terms[in_slot], x)


def bind_direct(plan: Plan, x: np.ndarray, op: Op) -> OneRound:
    """``direct``'s all-reduce of ``x`` as one bound round (``OneRound``): the same copy into
    the slot, the same reduction of every slot into ``x``."""
    s: Direct = plan.state
    red = s.red
    put, take = [], []
    for p in (0, 1):
        put.append((bound_copy(s.mine[p], x),) if red.raw else (partial(load, red, s.mine[p], x),))
        terms = s.terms[p]
        take.append((partial(s.pair, terms[0], terms[1], x),) if s.pair is not None
                    else (partial(reduce_terms, red, terms, x),))
    return OneRound(s.d, (put[0], put[1]), (take[0], take[1]))


@dataclass(frozen=True, slots=True)
class Split:
    """``split``'s state for one call shape.

    Attributes:
        d: the group's domain.
        red: the reduction.
        in_acc: ``red`` for results built in the accumulation dtype (this member's part).
        part: elements of each member's part.
        parts: per IN slot, this member's part of every member's slot (``reduce_terms``' form).
        mine: per IN slot, this member's slot.
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
    pair: Pair | None


class Pair(NamedTuple):
    """Two members, terms that are the caller's bytes: what a member publishes and reads.

    Attributes:
        own: this member's part of the array, as element bounds.
        given: the peer's part, as element bounds: the only bytes this member publishes.
        give: per IN slot, where the peer's part goes in this member's slot.
        take: per IN slot, this member's part in the peer's slot.
        first: this member is group rank 0 (its terms come first).
    """

    own: tuple[int, int]
    given: tuple[int, int]
    give: tuple[np.ndarray, np.ndarray]
    take: tuple[np.ndarray, np.ndarray]
    first: bool


def _pair(d: Any, red: Reduction, stacked: list[np.ndarray], count: int, part: int) -> Pair | None:
    """``Pair`` for an array (or chunk) of ``count`` elements in parts of ``part``, over the
    slot views ``stacked`` (one per IN slot); None unless two members and raw terms."""
    if d.size != 2 or not red.raw:
        return None
    r = d.rank
    own = (min(r * part, count), min((r + 1) * part, count))
    given = (min((1 - r) * part, count), min((2 - r) * part, count))
    return Pair(own, given, tuple(stacked[p][r, given[0]:given[1]] for p in (0, 1)),  # type: ignore[arg-type]
                tuple(stacked[p][1 - r, own[0]:own[1]] for p in (0, 1)), r == 0)  # type: ignore[arg-type]


def _reduce_pair(in_acc: Reduction, pair: Pair, in_slot: int, x: np.ndarray, out: np.ndarray) -> None:
    """Reduce this member's part of ``x`` with the peer's terms for it, in member order."""
    own, take = x[pair.own[0]:pair.own[1]], pair.take[in_slot]
    reduce_terms(in_acc, (own, take) if pair.first else (take, own), out)  # type: ignore[arg-type]


def prepare_split(team: Team, plan: Plan, x: np.ndarray, *rest: Any) -> Split:
    """``split``'s (and ``reduce_split``'s) state."""
    d, red = _domain(team, plan), _reduction(plan)
    part = part_size(x.size, d.size, red.acc.itemsize)
    a, b = min(d.rank * part, x.size), min((d.rank + 1) * part, x.size)
    stacked = [d.stacked(p, red.acc, x.size) for p in (0, 1)]
    outs = d.stacked_out(red.acc, part)
    return Split(d, red, red._replace(in_acc=True), part,
                 (_terms_of(stacked[0][:, a:b]), _terms_of(stacked[1][:, a:b])),
                 (stacked[0][d.rank], stacked[1][d.rank]), outs, outs[d.rank, :b - a],
                 _pair(d, red, stacked, x.size, part))


def split(ctx: Ctx, x: np.ndarray, op: Op, root: int | None = None) -> None:
    """Reduce ``x`` (at most one slot in the accumulation dtype) with each member reducing one part.

    Two waits: every member copies ``x`` into its IN slot and posts; member ``r`` reduces part
    ``r`` of every slot into its OUT region and posts; then everyone copies every part out of
    the OUT regions. Compared with ``direct`` it moves about the same bytes but does ``1/n`` of
    the arithmetic: better from a few tens of KiB up. ``x`` is written only after the last
    wait. Arguments as ``direct``.
    """
    s: Split = ctx.plan.state
    d, pair = s.d, s.pair
    in_slot = d.next_round()
    if pair is not None:
        pair.give[in_slot][...] = x[pair.given[0]:pair.given[1]]
        d.start(ctx)
        _reduce_pair(s.in_acc, pair, in_slot, x, s.my_out)
    else:
        load(s.red, s.mine[in_slot], x)
        d.start(ctx)
        reduce_terms(s.in_acc, s.parts[in_slot], s.my_out)
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
        in_out: two members, raw terms, and the whole array fits the OUT region or ``ring``:
            the call runs through the OUT regions alone (``_through_out``).
        ring: ``_through_out`` uses the OUT regions as rings of ``RING`` chunks (under a
            ``Journal`` where the group keeps arrays untouched or complete).
    """

    d: Any
    red: Reduction
    in_acc: Reduction
    chunk: int
    part: int
    chunks: int
    staged: bool
    in_out: bool
    ring: bool


def prepare_pipelined(team: Team, plan: Plan, x: np.ndarray, *rest: Any) -> Pipelined:
    """``pipelined``'s (and ``reduce_pipelined``'s) state."""
    d, red = _domain(team, plan), _reduction(plan)
    itemsize, target = red.acc.itemsize, min(d.slot_bytes, CHUNK_BYTES)
    align = 2 * max(1, 64 // itemsize)  # two parts of whole cache lines
    # through the OUT regions no slot bounds a chunk: chunks of one size near the target
    even = max(align, -(-x.size // max(1, round(x.nbytes / target)) // align) * align)
    ring = (RING * even * itemsize <= d.out_bytes
            and (not team.keep_going or x.nbytes >= KEEP_GOING_RING_BYTES))
    in_out = d.size == 2 and red.raw and (ring or x.nbytes <= d.out_bytes)
    chunk = even if in_out else target // itemsize
    part = part_size(chunk, d.size, itemsize)
    chunks = max(1, -(-x.size // chunk))
    return Pipelined(d, red, red._replace(in_acc=True), chunk, part, chunks,
                     chunks * part * itemsize <= d.out_bytes, in_out, ring)


def pipelined(ctx: Ctx, x: np.ndarray, op: Op, root: int | None = None) -> None:
    """Reduce ``x`` chunk by chunk through the slots; arguments as ``direct``, any size.

    Per chunk ``j`` every member posts twice: A(j) once its copy-in is done, B(j) once its part
    is reduced. Member ``r`` reduces chunk ``j`` after all A(j), posts B(j), copies chunk ``j+1``
    in and posts A(j+1), then copies chunk ``j`` out after all B(j). A member fills IN slot
    ``j % 2`` again only after all A(j+1), which peers post after reducing chunk ``j``; the same
    argument holds for the two OUT slots. When every member's reduced parts fit its OUT region
    they all stay there and are copied out at the end, after the last wait (nothing can fail
    then); otherwise each chunk is copied out as soon as it is complete, under a ``Journal`` where
    the group keeps arrays untouched or complete (``Team.keep_going``).
    """
    s: Pipelined = ctx.plan.state
    if s.in_out:
        _through_out(ctx, s, x, root is None or root == s.d.rank)
        return
    d, red, in_acc, chunk, part, chunks, staged = s.d, s.red, s.in_acc, s.chunk, s.part, s.chunks, s.staged
    r = d.rank
    acc, itemsize = red.acc, red.acc.itemsize
    writes = root is None or root == r
    streamed = writes and not staged  # each chunk copied out as soon as it is complete
    journal = Journal(d, [x]) if streamed and ctx.team.keep_going else None
    base, peers, mine = d.posts, d.peers, d.inbox[r]
    first = d.next_round()  # chunk j goes through IN slot (first + j) & 1

    def piece(j: int) -> np.ndarray:
        return x[j * chunk:(j + 1) * chunk]

    pairs = d.size == 2 and red.raw  # publish the peer's part only (``Pair``)

    def copy_in(j: int) -> None:
        if j:
            d.next_round()  # one round per chunk, as every member counts them
        x_j, slot = piece(j), mine[(first + j) & 1]
        if pairs:
            a, b = min((1 - r) * part, x_j.size), min((2 - r) * part, x_j.size)
            slot[a * itemsize:b * itemsize].view(acc)[...] = x_j[a:b]
        else:
            load(red, slot[:x_j.size * itemsize].view(acc), x_j)

    def out_parts(j: int) -> np.ndarray:
        return d.stacked_out(acc, part, offset=(j if staged else j & 1) * part * itemsize)

    def reduce_own(j: int) -> None:
        x_j = piece(j)
        a, b = min(r * part, x_j.size), min((r + 1) * part, x_j.size)
        stacked = d.stacked((first + j) & 1, acc, x_j.size)[:, a:b]
        terms = _terms_of(stacked)
        if pairs:  # this member's terms straight from ``x``
            terms = (x_j[a:b], stacked[1]) if r == 0 else (stacked[0], x_j[a:b])
        reduce_terms(in_acc, terms, out_parts(j)[r, :b - a])

    def copy_out(j: int) -> None:
        lo = j * chunk
        if journal is not None:
            journal.save(0, lo * x.itemsize, (lo + piece(j).size) * x.itemsize)
        _copy_parts(red, out_parts(j), part, piece(j))

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
            if streamed:
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


def _through_out(ctx: Ctx, s: Pipelined, x: np.ndarray, writes: bool) -> None:
    """``pipelined`` on two members with raw terms, through the OUT regions: chunk ``j`` of
    ``x`` has one place in each member's OUT region (its place in ``x``, or with ``s.ring`` its
    place in a ring of ``RING`` chunks), which holds the member's terms for its peer's part (the
    caller's bytes) and its own reduced part.

    After the call's first post (nobody reads the OUT regions of an earlier call any more) a
    member publishes chunk ``j``'s peer part and posts A(j); after the peer's A(j) it reduces its
    own part of ``x`` with the peer's terms into its OUT region and posts B(j), publishes chunk
    ``j + 1``, and after the peer's B(j) copies the peer's reduced part of chunk ``j`` into
    ``x`` while it is still in the caches.

    With ``s.ring`` each own part goes into ``x`` right after it is reduced, and a member writes
    a chunk's place again only after the peer's A of the chunk before (posted after the peer
    copied out the chunk three before: ``RING`` = 3); where the group keeps arrays untouched or
    complete (``Team.keep_going``) a ``Journal`` saves each chunk of ``x`` before its first
    write, while it is still in the caches. Without ``s.ring`` nothing in an OUT region is
    written twice in a call: the peer part's old bytes in ``x`` are the terms this member
    published, so a later failure puts them back from its OUT region, and the own parts are
    copied into ``x`` last, after the final wait, when nothing can fail any more. The next call
    writes an OUT region only after its first wait, when the peer has finished reading this one.
    """
    d, in_acc, chunk, part, chunks, ring = s.d, s.in_acc, s.chunk, s.part, s.chunks, s.ring
    r, peers, size = d.rank, d.peers, x.size
    acc = s.red.acc
    held = min(size, RING * chunk) if ring else size
    mine = d.outbox[r][:held * acc.itemsize].view(acc)
    theirs = d.outbox[1 - r][:held * acc.itemsize].view(acc)

    def part_of(j: int, q: int) -> tuple[int, int, int]:
        """Part ``q`` of chunk ``j``: its bounds in ``x`` and how far its place in the OUT
        regions lies from them."""
        lo = j * chunk
        length = min(chunk, size - lo)
        shift = (j % RING - j) * chunk if ring else 0
        return lo + min(q * part, length), lo + min((q + 1) * part, length), shift

    def publish(j: int) -> None:
        a, b, o = part_of(j, 1 - r)
        copy(mine[a + o:b + o], x[a:b])
        d.post()  # A(j)

    d.next_round()  # no IN slot: the round only keeps the members' counts alike
    d.start(ctx)
    base = d.posts  # start; then A(j) is post base + 1 + 2j, B(j) base + 2 + 2j
    copied = 0  # chunks whose peer part is in ``x``
    journal = Journal(d, [x]) if ring and writes and ctx.team.keep_going else None
    try:
        publish(0)
        for j in range(chunks):
            d.wait(peers, base + 1 + 2 * j, ctx)  # A(j)
            a, b, o = part_of(j, r)
            own, peer = x[a:b], theirs[a + o:b + o]
            reduce_terms(in_acc, (own, peer) if r == 0 else (peer, own), mine[a + o:b + o])  # type: ignore[arg-type]
            d.post()  # B(j)
            if ring and writes:
                if journal is not None:
                    lo = j * chunk * x.itemsize
                    journal.save(0, lo, lo + min(chunk, size - j * chunk) * x.itemsize)
                copy(own, mine[a + o:b + o])
            if j + 1 < chunks:
                publish(j + 1)
            if writes:
                d.wait(peers, base + 2 + 2 * j, ctx)  # B(j)
                a, b, o = part_of(j, 1 - r)
                copied = j + 1
                copy(x[a:b], theirs[a + o:b + o])
        d.wait(peers, base + 2 * chunks, ctx)  # B(last): a member that writes has waited for it
    except BaseException:
        if journal is not None:
            journal.restore()
        elif not ring:
            for j in range(copied):
                a, b, o = part_of(j, 1 - r)
                copy(x[a:b], mine[a + o:b + o])
        raise
    if writes and not ring:
        for j in range(chunks):
            a, b, o = part_of(j, r)
            copy(x[a:b], mine[a + o:b + o])


def reduce_direct(ctx: Ctx, x: np.ndarray, root: int, op: Op) -> None:
    """``reduce`` onto group rank ``root`` in one round (see ``direct``)."""
    direct(ctx, x, op, root)


def reduce_split(ctx: Ctx, x: np.ndarray, root: int, op: Op) -> None:
    """``reduce`` onto group rank ``root``, each member reducing one part (see ``split``)."""
    split(ctx, x, op, root)


def reduce_pipelined(ctx: Ctx, x: np.ndarray, root: int, op: Op) -> None:
    """``reduce`` onto group rank ``root`` through the pipeline (see ``pipelined``)."""
    pipelined(ctx, x, op, root)
