"""Same-host all-reduce and reduce: members read each other's slots in place.

``direct`` serves contributions that fit one IN slot: each member copies its array into its slot
(alternating between its two slots from call to call, so no closing barrier is needed), waits for
every peer's copy, and reduces all slots, in member order, straight into its own array: one post
and one wait per call, and the caller's array is written only once every peer's data is in.

``pipelined`` serves anything larger, in slot-sized chunks, with bounded memory. Each chunk is cut
into one part per member; member ``r`` copies in only the parts its peers reduce, reduces part
``r`` (its own term read from its own array directly) into its OUT region, then copies every
member's reduced part out. The next chunk's copy-in overlaps the peers' reductions. Each part is
reduced by one member and copied by the others, so every member ends with the same bits.

Both follow ``kernels``' accumulation rule (half precision combines in float32, PREMUL_SUM
premultiplies each term, AVG divides once, then one rounding) and write results into the caller's
array only when nothing can fail any more, or under a ``Journal`` that undoes a failed call.
This module must not import ``core``.
"""

from __future__ import annotations

import numpy as np

from ..types import ReduceOp
from .base import Ctx
from .shm_common import Journal, Op, alone, fold, load, no_domain, reduction_plan


def direct(ctx: Ctx, x: np.ndarray, op: Op, root: int | None = None) -> None:
    """Reduce ``x`` (1-D, C-contiguous, at most one slot in the accumulation dtype) in one round.

    Args:
        ctx: the call's group view; ``ctx.team.shm`` is the group's domain, and
            ``ctx.signature`` describes this call (its dtype, count and op key the cached set-up).
        x: this member's array; receives the result (on ``root`` only, when given).
        op: the caller's reduction (AVG and PREMUL_SUM included).
        root: the group rank that gets the result (``reduce``), or None for every member.
    """
    d = ctx.team.shm
    if d is None:
        raise no_domain(ctx)
    # The call's signature (one object per call shape) names dtype, count and op; a PremulSum's
    # factor is not in it.
    key = ctx.signature if type(op) is ReduceOp else (ctx.signature, op)
    found = d.memo.get(key)
    if found is None:
        plan = reduction_plan(op, x.dtype)
        # One ufunc call makes the result; numpy parses a positional ``out`` faster but deprecates
        # it for maximum and minimum.
        pair = plan.raw and not plan.average and d.size == 2 and \
            plan.ufunc is not np.maximum and plan.ufunc is not np.minimum
        even, odd = d.views(0, plan.acc, x.size), d.views(1, plan.acc, x.size)
        found = d.remember(key, (plan, pair, even, odd, even[d.rank], odd[d.rank]))
    plan, pair = found[0], found[1]
    rounds = d.round
    parity = rounds & 1
    terms = found[2 + parity]
    if plan.raw:
        found[4 + parity][...] = x
    else:
        load(plan, found[4 + parity], x)
    d.start(ctx, None)  # no extent: nobody reads it for a reduction
    d.round = rounds + 1
    if root is None or root == d.rank:
        if pair:  # the 8-byte latency case, unrolled
            plan.ufunc(terms[0], terms[1], x)
        else:
            fold(plan, terms, x, d.size)


# Bytes of one pipelined chunk (at most one IN slot). Large enough that the two posts and waits
# per chunk cost little; the benchmark suite is where to tune it.
CHUNK_BYTES = 1 << 20


def _parts(lo: int, hi: int, size: int, align: int) -> list[int]:
    """Boundaries of ``size`` parts of ``[lo, hi)``, each starting on an ``align``-element mark."""
    length = hi - lo
    return [lo + (i * length // size) // align * align for i in range(size)] + [hi]


def _split_setup(d, op: Op, x: np.ndarray) -> tuple:  # type: ignore[no-untyped-def,type-arg]
    """What ``split`` computes once per call shape (kept in the domain's memo): part bounds and,
    per IN slot parity, the views of the peers' copies of this member's part; the OUT views."""
    n, r = d.size, d.rank
    plan = reduction_plan(op, x.dtype)
    acc, itemsize = plan.acc, plan.acc.itemsize
    bounds = _parts(0, x.size, n, max(1, 64 // itemsize))
    a, b = bounds[r], bounds[r + 1]
    theirs = tuple(tuple(d.inbox[q][p][a * itemsize:b * itemsize].view(acc) for q in range(n) if q != r)
                   for p in (0, 1))
    mine = tuple(d.inbox[r][p][:bounds[-1] * itemsize].view(acc) for p in (0, 1))
    outs = tuple(d.outbox[q][:(bounds[q + 1] - bounds[q]) * itemsize].view(acc) for q in range(n))
    return plan, plan._replace(in_acc=True), bounds, theirs, mine, outs, acc == x.dtype


def split(ctx: Ctx, x: np.ndarray, op: Op, root: int | None = None) -> None:
    """Reduce ``x`` (at most one slot in the accumulation dtype) with each member reducing one part.

    Two rounds: every member copies into its IN slot the parts of ``x`` its peers reduce and
    posts; member ``r`` folds part ``r`` of every member (its own term read from ``x`` in place,
    the others from the peers' slots, in member order) into its OUT region and posts; then
    everyone copies every part out of the OUT regions. Compared with ``direct`` it moves about the
    same bytes but does ``1/n`` of the arithmetic, for one more wait: better from a few tens of
    KiB up. ``x`` is written only after the last wait. Arguments as ``direct``.
    """
    d = ctx.team.shm
    if d is None:
        raise no_domain(ctx)
    key = ("split", ctx.signature if type(op) is ReduceOp else (ctx.signature, op))
    setup = d.memo.get(key)
    if setup is None:
        setup = d.remember(key, _split_setup(d, op, x))
    plan, in_out, bounds, theirs, mine, outs, same_dtype = setup
    n, r = d.size, d.rank
    rounds = d.round
    parity = rounds & 1
    a, b, end = bounds[r], bounds[r + 1], bounds[-1]
    slot = mine[parity]
    if a:
        load(plan, slot[:a], x[:a])
    if end > b:
        load(plan, slot[b:end], x[b:end])
    d.start(ctx, None)
    d.round = rounds + 1
    own = x[a:b]
    if not plan.raw:
        own = np.empty(b - a, dtype=plan.acc)
        load(plan, own, x[a:b])
    terms = list(theirs[parity])
    terms.insert(r, own)
    fold(in_out, terms, outs[r], n)
    d.post()
    d.wait(d.peers, d.posts, ctx)
    if root is not None and root != r:
        return
    for q in range(n):
        lo, hi = bounds[q], bounds[q + 1]
        if same_dtype:
            x[lo:hi] = outs[q]
        else:
            np.copyto(x[lo:hi], outs[q], casting="unsafe")


def _pipeline_setup(d, op: Op, x: np.ndarray) -> tuple:  # type: ignore[no-untyped-def,type-arg]
    """What ``pipelined`` computes once per call shape (kept in the domain's memo)."""
    n = d.size
    plan = reduction_plan(op, x.dtype)
    itemsize = plan.acc.itemsize
    chunk = min(d.slot_bytes, CHUNK_BYTES) // itemsize
    chunks = max(1, -(-x.size // chunk))
    align = max(1, 64 // itemsize)
    part_cap = (-(-chunk // n) // align + 2) * align  # bounds the longest part of ``_parts``
    staged = chunks * part_cap * itemsize <= d.out_bytes
    # Part boundaries relative to a chunk's start: the same for every chunk but the last.
    full = _parts(0, chunk, n, align)
    tail = _parts(0, x.size - (chunks - 1) * chunk, n, align)
    in_out = plan._replace(in_acc=True)  # reduced parts stay in the accumulation dtype
    return plan, in_out, chunk, chunks, part_cap, staged, full, tail, plan.acc == x.dtype


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
    d = ctx.team.shm
    if d is None:
        raise no_domain(ctx)
    n, r = d.size, d.rank
    key = ("pipelined", ctx.signature if type(op) is ReduceOp else (ctx.signature, op))
    setup = d.memo.get(key)
    if setup is None:
        setup = d.remember(key, _pipeline_setup(d, op, x))
    plan, in_out, chunk, chunks, part_cap, staged, full, tail, same_dtype = setup
    if n == 1:
        d.start(ctx)
        alone(plan, x)
        return
    itemsize, acc = plan.acc.itemsize, plan.acc
    writes = root is None or root == r
    journal = Journal(d, [x]) if writes and not staged else None
    own = None if plan.raw else np.empty(part_cap, dtype=acc)
    first, base, peers = d.round, d.posts, d.peers
    inbox, outbox, mine = d.inbox, d.outbox, d.inbox[r]

    def copy_in(j: int) -> None:
        bounds, lo = (full if j + 1 < chunks else tail), j * chunk
        slot = mine[(first + j) & 1][:bounds[-1] * itemsize].view(acc)
        a, b, end = bounds[r], bounds[r + 1], bounds[-1]
        if a:
            load(plan, slot[:a], x[lo:lo + a])
        if end > b:
            load(plan, slot[b:end], x[lo + b:lo + end])

    def out_part(q: int, j: int, length: int) -> np.ndarray:
        start = (j if staged else j & 1) * part_cap * itemsize
        return outbox[q][start:start + length * itemsize].view(acc)

    def reduce_own(j: int) -> None:
        bounds, lo = (full if j + 1 < chunks else tail), j * chunk
        a, b = bounds[r], bounds[r + 1]
        parity = (first + j) & 1
        terms = []
        for q in range(n):
            if q != r:
                terms.append(inbox[q][parity][a * itemsize:b * itemsize].view(acc))
            elif own is None:
                terms.append(x[lo + a:lo + b])
            else:
                load(plan, own[:b - a], x[lo + a:lo + b])
                terms.append(own[:b - a])
        fold(in_out, terms, out_part(r, j, b - a), n)

    def copy_out(j: int) -> None:
        bounds, lo = (full if j + 1 < chunks else tail), j * chunk
        if journal is not None:
            journal.save(0, lo * x.itemsize, (lo + bounds[-1]) * x.itemsize)
        for q in range(n):
            a, b = bounds[q], bounds[q + 1]
            if b > a:
                if same_dtype:
                    x[lo + a:lo + b] = out_part(q, j, b - a)
                else:
                    np.copyto(x[lo + a:lo + b], out_part(q, j, b - a), casting="unsafe")

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
    d.round = first + chunks
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
