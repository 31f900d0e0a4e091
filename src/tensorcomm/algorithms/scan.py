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
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..types import PremulSum, ReduceOp
from .base import Ctx, Plan, Team
from .kernels import combine, divide
from .shm_common import Journal, Reduction, load, no_domain, reduce_terms
from .wire import chunk_elements, scratch, spans

Op = ReduceOp | PremulSum


def terms(rank: int, inclusive: bool) -> int:
    """How many members' values group rank ``rank``'s result combines."""
    return rank + 1 if inclusive else rank


def doubling(ctx: Ctx, own: np.ndarray, op: ReduceOp) -> np.ndarray | None:
    """The recursive doubling on ``own``, this rank's terms in the accumulation dtype (read only).

    Returns the exclusive prefix (the lower ranks' terms combined; None on rank 0), in scratch.
    Each round sends this rank's running block total and receives the partner's in chunks,
    combining each chunk as it arrives; the new block total goes to the other of two scratch
    buffers (the old one may still be on its way out), and is not computed when no later round
    sends it. The first block received from below becomes the prefix without a copy.
    """
    n, r = ctx.size, ctx.rank
    pieces = spans(0, own.size, chunk_elements(own.itemsize))
    arriving = scratch(ctx, "scan in 0", own.size, own.dtype)
    total, prefix, which = own, None, 0
    mask, step = 1, 0
    while mask < n:
        peer = r ^ mask
        if peer < n:
            below = peer < r  # the partner's block comes first: it is the left operand
            new_total = None
            if _sends_again(r, mask, n):
                which ^= 1
                new_total = scratch(ctx, f"scan total {which}", own.size, own.dtype)
            receiving = [ctx.irecv(peer, arriving[lo:hi], step) for lo, hi in pieces]
            sending = [ctx.isend(peer, total[lo:hi], step) for lo, hi in pieces]
            for (lo, hi), request in zip(pieces, receiving, strict=True):
                ctx.wait(request)
                part = arriving[lo:hi]
                if new_total is not None:
                    if below:
                        combine(op, part, total[lo:hi], new_total[lo:hi])
                    else:
                        combine(op, total[lo:hi], part, new_total[lo:hi])
                if below and prefix is not None:
                    combine(op, part, prefix[lo:hi], prefix[lo:hi])
            for request in sending:
                ctx.wait(request)
            if below and prefix is None:  # keep it: later rounds receive into the other buffer
                prefix, arriving = arriving, scratch(ctx, "scan in 1", own.size, own.dtype)
            if new_total is not None:
                total = new_total
        mask, step = mask * 2, step + 1
    return prefix


def _sends_again(rank: int, mask: int, n: int) -> bool:
    """Whether ``rank`` has a partner in a round after the one at distance ``mask``."""
    mask *= 2
    while mask < n:
        if rank ^ mask < n:
            return True
        mask *= 2
    return False


def _reduction(plan: Plan) -> Reduction:
    if plan.reduction is None:
        raise TypeError(f"{plan.label}: a reduction's plan has no reduction descriptor")
    return plan.reduction


def recursive_doubling(inclusive: bool) -> Callable[[Ctx, np.ndarray, Op], None]:
    """The transport algorithm of ``scan`` (``inclusive``) or ``exscan``. ``x`` is read (or
    loaded into scratch in the accumulation dtype) and written only once the call has succeeded."""
    def run(ctx: Ctx, x: np.ndarray, op: Op) -> None:
        red = _reduction(ctx.plan)
        own = x
        if not red.raw:
            own = scratch(ctx, "scan own", x.size, red.acc)
            load(red, own, x)
        prefix = doubling(ctx, own, red.op)
        count = terms(ctx.rank, inclusive)
        if prefix is None:  # rank 0: its own terms (scan) or nothing (exscan)
            if count and own is not x:
                np.copyto(x, own, casting="unsafe")
            return
        if inclusive:
            combine(red.op, prefix, own, prefix)
        if red.average:
            divide(prefix, count)
        np.copyto(x, prefix, casting="unsafe")  # the one rounding of the accumulation rule
    run.__name__ = run.__qualname__ = "staged_recursive_doubling"  # select's transport rows are staged
    return run


@dataclass(frozen=True, slots=True)
class Prefix:
    """``shm_prefix``'s state for one call shape.

    Attributes:
        d: the group's domain.
        red: the reduction.
        count: how many members' slots this member reduces (``terms``).
        chunk: elements of one round (one slot's worth in the accumulation dtype).
        rounds: rounds of the call.
        firsts: per IN slot, the first ``count`` members' slots, when one round holds the call.
    """

    d: Any
    red: Reduction
    count: int
    chunk: int
    rounds: int
    firsts: tuple[np.ndarray, np.ndarray] | None


def prepare_prefix(inclusive: bool) -> Callable[..., Prefix]:
    """``shm_prefix(inclusive)``'s ``Row.prepare``."""
    def prepare(team: Team, plan: Plan, x: np.ndarray, op: Op) -> Prefix:
        d = team.shm
        if d is None:
            raise no_domain(plan)
        red = _reduction(plan)
        count = terms(d.rank, inclusive)
        chunk = max(1, d.slot_bytes // red.acc.itemsize)
        rounds = max(1, -(-x.size // chunk))
        firsts = None
        if rounds == 1:
            stacked = [d.stacked(p, red.acc, x.size) for p in (0, 1)]
            firsts = (stacked[0][:count], stacked[1][:count])
        return Prefix(d, red, count, chunk, rounds, firsts)
    return prepare


def shm_prefix(inclusive: bool) -> Callable[[Ctx, np.ndarray, Op], None]:
    """The shared-memory algorithm of ``scan`` (``inclusive``) or ``exscan``; its state comes from
    ``prepare_prefix(inclusive)``."""
    def run(ctx: Ctx, x: np.ndarray, op: Op) -> None:
        s: Prefix = ctx.plan.state
        d, red, count, chunk = s.d, s.red, s.count, s.chunk
        mine = d.inbox[d.rank]
        if s.firsts is not None:  # one round: the common case, in a straight line
            in_slot = d.next_round()
            load(red, mine[in_slot][:x.size * red.acc.itemsize].view(red.acc), x)
            d.start(ctx)
            if count:
                reduce_terms(red, s.firsts[in_slot], x)
            return
        journal = Journal(d, [x]) if count and ctx.team.keep_going else None
        base = d.posts
        try:
            for t in range(s.rounds):
                lo, hi = t * chunk, min((t + 1) * chunk, x.size)
                in_slot = d.next_round()
                load(red, mine[in_slot][:(hi - lo) * red.acc.itemsize].view(red.acc), x[lo:hi])
                if t:
                    d.post()
                    d.wait(d.peers, base + t + 1, ctx)
                else:
                    d.start(ctx)
                if count:
                    if journal is not None:
                        journal.save(0, lo * x.itemsize, hi * x.itemsize)
                    reduce_terms(red, d.stacked(in_slot, red.acc, hi - lo)[:count], x[lo:hi])
        except BaseException:
            if journal is not None:
                journal.restore()
            raise
    run.__name__ = run.__qualname__ = "shm_prefix"
    return run
