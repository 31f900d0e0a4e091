"""All-reduce algorithms: ring (bandwidth-optimal) and recursive doubling (log latency).

Both are in place on a 1-D, C-contiguous buffer already in the accumulation dtype (see
``kernels.prepare``), and both leave bit-identical results on every rank (see each docstring for
why). Algorithms talk through ``Ctx`` only; this module must not import ``core``.
"""

from __future__ import annotations

import numpy as np

from .allgather import bounds, even_counts, ring_inplace
from .base import Ctx
from .kernels import combine
from .reduce_scatter import ring_reduce
from ..types import ReduceOp


def ring(ctx: Ctx, buf: np.ndarray, op: ReduceOp) -> None:
    """Ring reduce-scatter then ring all-gather of ``size`` near-equal blocks of ``buf``.

    Every block is reduced at exactly one rank and then copied around the ring, so all ranks end
    with the same bits. Scratch: two blocks.
    """
    offsets = bounds(even_counts(buf.size, ctx.size))
    own = buf[offsets[ctx.rank]:offsets[ctx.rank + 1]]
    ring_reduce(ctx, buf, offsets, op, own)
    ring_inplace(ctx, buf, offsets, step_base=ctx.size - 1)


def recursive_doubling(ctx: Ctx, buf: np.ndarray, op: ReduceOp) -> None:
    """Exchange whole buffers with partners at distance 1, 2, 4, ... and combine.

    With p the largest power of two <= size and e = size - p, ranks 2i and 2i + 1 (i < e) first
    fold: the even rank sends its buffer to the odd one and waits; p ranks remain, renumbered
    0..p-1, and run log2(p) exchange rounds; the odd ranks then send the result back. Both peers
    of a round compute ``(value of the lower-numbered half) op (value of the upper half)``, so
    every rank evaluates the same expression tree in the same operand order and the results are
    bit-identical (operand order matters for signed zeros and NaN payloads). Scratch: one buffer.
    """
    n, r = ctx.size, ctx.rank
    if n == 1:
        return
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    unfold_step = p.bit_length()  # fold is step 0, the rounds are steps 1 .. log2(p)
    if r < 2 * extra and r % 2 == 0:
        ctx.send(r + 1, buf, step=0)
        ctx.recv(r + 1, buf, step=unfold_step)
        return
    incoming = np.empty_like(buf)
    if r < 2 * extra:
        ctx.recv(r - 1, incoming, step=0)
        combine(op, incoming, buf, buf)
        virtual = r // 2
    else:
        virtual = r - extra
    mask, step = 1, 1
    while mask < p:
        partner_virtual = virtual ^ mask
        partner = 2 * partner_virtual + 1 if partner_virtual < extra else partner_virtual + extra
        ctx.sendrecv(partner, buf, partner, incoming, step)
        if partner_virtual < virtual:
            combine(op, incoming, buf, buf)
        else:
            combine(op, buf, incoming, buf)
        mask, step = mask * 2, step + 1
    if r < 2 * extra:
        ctx.send(r - 1, buf, step=unfold_step)
