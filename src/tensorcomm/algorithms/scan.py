"""Prefix reductions, MPI's ``Scan`` and ``Exscan``: recursive doubling and the shared-memory prefix.

Group rank ``r`` ends with ``x_0 op x_1 op ... op x_r`` (``scan``, inclusive) or ``x_0 op ... op
x_(r-1)`` (``exscan``, exclusive), in place; an exclusive scan leaves rank 0's array as it is
(MPI leaves it undefined). Lower ranks are always the left operand, so the result does not depend
on timing (IEEE ``min(0.0, -0.0)`` and NaN payloads follow operand order). Reductions follow
``kernels``' accumulation rule, as all-reduce does: float16 and bfloat16 SUM, AVG, PREMUL_SUM and
PROD combine in float32 and round once at the end; PREMUL_SUM multiplies every term by its factor;
AVG is the running mean, the prefix's sum divided by the number of terms in it (``r + 1``, or
``r`` for ``exscan``).

Both algorithms take ``(ctx, x, op)`` after the row's ``inclusive`` flag (``select.py``'s rows bind
it): ``x`` the caller's flat array, ``op`` the caller's op.

``recursive_doubling`` (over the transport; MPICH's ``MPI_Scan`` algorithm, Hillis and Steele's
scan): for ``d = 1, 2, 4, ...`` rank ``r`` swaps its running block total with rank ``r xor d`` (when
that rank exists) and, if the partner is lower, folds what arrives into its result. ``ceil(log2
n)`` rounds, each moving the whole buffer once each way, for any ``n``.

``shm_prefix`` (shared memory): every member copies its terms into its IN slot and waits for the
others' once (the round that announces the call); member ``r`` then reduces slots ``0..r`` (or
``0..r-1``) with one numpy call straight into its array. One wait instead of ``log2 n``, and member
``r`` reads ``r`` slots: at the group sizes one host holds this beats doubling rounds (measured:
docs/split_scan.md). A contribution larger than one slot goes round by round, one slot's worth
each, under a ``Journal`` that undoes a failed call. Algorithms talk through ``Ctx`` only; this
module must not import ``core``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..types import PremulSum, ReduceOp
from .base import Ctx
from .kernels import combine
from .shm_common import Journal, load, no_domain, reduce_rows, reduction
from .wire import scratch

Op = ReduceOp | PremulSum


def terms(rank: int, inclusive: bool) -> int:
    """How many members' values group rank ``rank``'s result combines."""
    return rank + 1 if inclusive else rank


def doubling(ctx: Ctx, partial: np.ndarray, result: np.ndarray, op: ReduceOp, inclusive: bool) -> bool:
    """The recursive doubling on buffers in the accumulation dtype.

    ``partial`` holds this rank's terms on entry and is overwritten (it becomes the total of this
    rank's block of ``2^k`` ranks after round ``k``). Returns whether ``result`` holds a result:
    the prefix up to this rank (``inclusive``) or up to the rank before it (not on rank 0).
    """
    n, r = ctx.size, ctx.rank
    incoming = scratch(ctx, "scan incoming", partial.size, partial.dtype)
    held = inclusive
    if inclusive:
        result[...] = partial
    mask, step = 1, 0
    while mask < n:
        peer = r ^ mask
        if peer < n:
            ctx.sendrecv(peer, partial, peer, incoming, step)
            if peer < r:  # the partner's block comes first: it is the left operand
                if held:
                    combine(op, incoming, result, result)
                else:
                    result[...] = incoming
                    held = True
                combine(op, incoming, partial, partial)
            else:
                combine(op, partial, incoming, partial)
        mask, step = mask * 2, step + 1
    return held


def recursive_doubling(inclusive: bool) -> Callable[[Ctx, np.ndarray, Op], None]:
    """The transport algorithm of ``scan`` (``inclusive``) or ``exscan``, on scratch copies: the
    caller's array is written only once the call has succeeded."""
    def run(ctx: Ctx, x: np.ndarray, op: Op) -> None:
        red = reduction(op, x.dtype)
        partial = scratch(ctx, "scan partial", x.size, red.acc)
        load(red, partial, x)
        result = scratch(ctx, "scan result", x.size, red.acc)
        if doubling(ctx, partial, result, red.op, inclusive):
            if red.average:
                np.divide(result, terms(ctx.rank, inclusive), out=result)
            np.copyto(x, result, casting="unsafe")  # the one rounding of the accumulation rule
    run.__name__ = run.__qualname__ = "staged_recursive_doubling"  # select's transport rows are staged
    return run


def shm_prefix(inclusive: bool) -> Callable[[Ctx, np.ndarray, Op], None]:
    """The shared-memory algorithm of ``scan`` (``inclusive``) or ``exscan``."""
    def run(ctx: Ctx, x: np.ndarray, op: Op) -> None:
        d = ctx.team.shm
        if d is None:
            raise no_domain(ctx)
        plan = ctx.plan
        if plan.state is None:
            red = reduction(op, x.dtype)
            plan.state = red, max(1, d.slot_bytes // red.acc.itemsize)
        red, chunk = plan.state
        count = terms(d.rank, inclusive)
        rounds = max(1, -(-x.size // chunk))
        journal = Journal(d, [x]) if rounds > 1 and count else None
        mine, base = d.inbox[d.rank], d.posts
        try:
            for t in range(rounds):
                lo, hi = t * chunk, min((t + 1) * chunk, x.size)
                parity = d.next_round()
                load(red, mine[parity][:(hi - lo) * red.acc.itemsize].view(red.acc), x[lo:hi])
                if t:
                    d.post()
                    d.wait(d.peers, base + t + 1, ctx)
                else:
                    d.start(ctx)
                if count:
                    if journal is not None:
                        journal.save(0, lo * x.itemsize, hi * x.itemsize)
                    reduce_rows(red, d.stacked(parity, red.acc, hi - lo)[:count], x[lo:hi])
        except BaseException:
            if journal is not None:
                journal.restore()
            raise
    run.__name__ = run.__qualname__ = "shm_prefix"
    return run
