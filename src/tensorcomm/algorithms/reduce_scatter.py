"""Reduce-scatter: the ring algorithm, also the first half of ring all-reduce.

Algorithms talk through ``Ctx`` only; this module must not import ``core``. Buffers are 1-D,
C-contiguous numpy arrays already in the accumulation dtype (see ``kernels.prepare``); sizes are
in elements.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .allgather import bounds
from .base import Ctx
from .kernels import combine
from ..types import ReduceOp


def ring_reduce(ctx: Ctx, send: np.ndarray, offsets: Sequence[int], op: ReduceOp,
                out: np.ndarray, step_base: int = 0) -> None:
    """Reduce block i (``send[offsets[i]:offsets[i+1]]``) of every rank into ``out`` on rank i.

    Block b starts at rank b + 1 and travels the ring rightwards; each rank combines what it
    receives (left operand) with its own block b (right operand) and passes the partial on, so
    block b is reduced in one place, in one fixed order: ``((x[b+1] op x[b+2]) op ...) op x[b]``.
    ``send`` is only read, except that ``out`` may be rank r's own block of ``send`` (ring
    all-reduce), which is read for the last time when it is written. Scratch: two blocks.
    Uses steps ``step_base .. step_base + size - 2``.
    """
    n, r = ctx.size, ctx.rank
    if n == 1:
        out[...] = send[offsets[0]:offsets[1]]
        return
    right, left = (r + 1) % n, (r - 1) % n
    widest = max(hi - lo for lo, hi in zip(offsets, offsets[1:]))
    partial = np.empty(widest, dtype=send.dtype)
    incoming = np.empty(widest, dtype=send.dtype)
    outgoing = send[offsets[(r - 1) % n]:offsets[(r - 1) % n + 1]]
    for s in range(n - 1):
        block = (r - s - 2) % n  # what the left neighbour sends at this step
        lo, hi = offsets[block], offsets[block + 1]
        ctx.sendrecv(right, outgoing, left, incoming[:hi - lo], step_base + s)
        # The send has completed, so the partial just sent may be overwritten.
        target = out if s == n - 2 else partial[:hi - lo]
        combine(op, incoming[:hi - lo], send[lo:hi], target)
        outgoing = target


def ring(ctx: Ctx, send: np.ndarray, out: np.ndarray, counts: Sequence[int], op: ReduceOp) -> None:
    """Reduce every rank's ``send`` element-wise and leave block ``ctx.rank`` of it in ``out``.

    Args:
        ctx: the call's group view.
        send: ``sum(counts)`` elements, block i (``counts[i]`` elements) destined for rank i;
            not modified.
        out: ``counts[ctx.rank]`` elements.
        counts: block sizes per rank.
        op: a base op (SUM, PROD, MIN, MAX, BAND, BOR, BXOR).
    """
    ring_reduce(ctx, send, bounds(counts), op, out)
