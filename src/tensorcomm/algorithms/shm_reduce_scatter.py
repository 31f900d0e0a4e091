"""Same-host reduce-scatter: member ``i`` reduces block ``i`` of every member's input in place.

Members publish their inputs (in the accumulation dtype, premultiplied: ``kernels``' rule) one
slot per round, leaving out their own block, which they read from their own input; member ``i``
folds block ``i`` of all members, in member order, into its output as each round brings it (an
output only: a call that fails after its first round may leave it partly written). This module
must not import ``core``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..types import ReduceOp
from .allgather import bounds
from .base import Ctx
from .shm_common import Journal, Op, Stream, fold, load, no_domain, reduction_plan, run_rounds


def _one_slot(d, op: Op, dtype: np.dtype, counts: tuple[int, ...]):  # type: ignore[no-untyped-def]
    """Set-up of a one-round reduce-scatter (kept in the domain's memo), or False when the
    terms (in the accumulation dtype) do not fit one slot."""
    plan = reduction_plan(op, dtype)
    acc, r = plan.acc, d.rank
    starts = bounds(counts)
    if starts[-1] * acc.itemsize > d.slot_bytes:
        return False
    mine = tuple(d.inbox[r][p][:starts[-1] * acc.itemsize].view(acc) for p in (0, 1))
    theirs = tuple(tuple(d.inbox[q][p][starts[r] * acc.itemsize:starts[r + 1] * acc.itemsize].view(acc)
                         for q in range(d.size) if q != r) for p in (0, 1))
    return plan, plan._replace(factor=None, raw=True), starts, mine, theirs


def reduce_scatter(ctx: Ctx, out: np.ndarray, inputs: Sequence[np.ndarray], op: Op) -> None:
    """Reduce ``inputs[i]`` across members into member ``i``'s ``out``.

    Args:
        out: this member's 1-D array of ``inputs[ctx.rank].size`` elements.
        inputs: one 1-D array per member (the same sizes on every member).
        op: the caller's reduction.
    """
    d = ctx.team.shm
    if d is None:
        raise no_domain(ctx)
    n, r = d.size, d.rank
    counts = tuple(i.size for i in inputs)
    key = ("reduce_scatter", ctx.signature if type(op) is ReduceOp else (ctx.signature, op), counts)
    setup = d.memo.get(key)
    if setup is None:
        setup = d.remember(key, _one_slot(d, op, out.dtype, counts))
    if setup is not False:  # one round: fold this member's block of every slot, in place
        plan, raw_plan, starts, mine, theirs = setup
        rounds = d.round
        parity = rounds & 1
        slot = mine[parity]
        for q in d.peers:
            load(plan, slot[starts[q]:starts[q + 1]], inputs[q])
        d.start(ctx, None)  # nobody reads extents in one round
        d.round = rounds + 1
        own = inputs[r]
        if not plan.raw:
            own = np.empty(own.size, dtype=plan.acc)
            load(plan, own, inputs[r])
        terms = list(theirs[parity])
        terms.insert(r, own)
        fold(raw_plan, terms, out, n)
        return
    plan = reduction_plan(op, out.dtype)
    if not plan.raw:  # terms travel in the accumulation dtype, premultiplied
        prepared = []
        for block in inputs:
            terms = np.empty(block.size, dtype=plan.acc)
            load(plan, terms, block)
            prepared.append(terms)
        inputs = prepared
    itemsize = plan.acc.itemsize
    offsets = bounds([i.nbytes for i in inputs])
    start, stop = offsets[r], offsets[r + 1]
    own = inputs[r]
    raw_plan = plan._replace(factor=None, raw=True)  # terms are prepared already

    def read(parity: int, lo: int, hi: int, journal: Journal | None) -> None:
        a, b = max(lo, start), min(hi, stop)
        if a >= b:
            return
        i, j = (a - start) // itemsize, (b - start) // itemsize
        terms = [own[i:j] if q == r else d.inbox[q][parity][a - lo:b - lo].view(plan.acc)
                 for q in range(n)]
        if journal is not None:
            journal.save(0, i * out.itemsize, j * out.itemsize)
        fold(raw_plan, terms, out[i:j], n)

    run_rounds(ctx, Stream.of(inputs, skip=r), read)  # ``out`` is an output only: no journal
