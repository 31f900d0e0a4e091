"""All-reduce algorithms: ring (bandwidth-optimal) and recursive doubling (log latency).

Both are in place on a 1-D, C-contiguous buffer already in the accumulation dtype (see
``kernels.prepare``), and both leave bit-identical results on every rank (see each docstring for
why). Algorithms talk through ``Ctx`` only; this module must not import ``core``.
"""

from __future__ import annotations

import numpy as np

from ..types import ReduceOp
from .allgather import bounds, even_counts, ring_inplace
from .base import Ctx
from .kernels import combine
from .reduce_scatter import ring_reduce
from .wire import chunk_elements, compressed, recv_chunked, round_to, scratch, send_chunked, spans


def ring(ctx: Ctx, buf: np.ndarray, op: ReduceOp) -> None:
    """Ring reduce-scatter then ring all-gather of ``size`` near-equal blocks of ``buf``.

    Every block is reduced at exactly one rank and then copied around the ring, so all ranks end
    with the same bits; both passes are pipelined in chunks (``reduce_scatter.ring_reduce``,
    ``allgather.ring_inplace``). With wire compression the owner rounds its reduced block to the
    wire dtype before passing it on, so every rank holds the same rounded values. Scratch: four
    blocks (see ``ring_reduce``).
    """
    offsets = bounds(even_counts(buf.size, ctx.size))
    own = buf[offsets[ctx.rank]:offsets[ctx.rank + 1]]
    ring_reduce(ctx, buf, offsets, op, own)
    wire = compressed(ctx, buf.dtype, op)
    if wire is not None:
        round_to(wire, own)
    ring_inplace(ctx, buf, offsets, step_base=ctx.size - 1, wire=wire)


def recursive_doubling(ctx: Ctx, buf: np.ndarray, op: ReduceOp) -> None:
    """Exchange whole buffers with partners at distance 1, 2, 4, ... and combine.

    With p the largest power of two <= size and e = size - p, ranks 2i and 2i + 1 (i < e) first
    fold: the even rank sends its buffer to the odd one and waits; p ranks remain, renumbered
    0..p-1, and run log2(p) exchange rounds; the odd ranks then send the result back. Both peers
    of a round compute ``(value of the lower-numbered half) op (value of the upper half)``, so
    every rank evaluates the same expression tree in the same operand order and the results are
    bit-identical (operand order matters for signed zeros and NaN payloads). Buffers travel in
    chunks, each combined as it arrives. With wire compression both partners of a round round
    their own value to the wire dtype first (each then adds the same two rounded values), and the
    result is rounded once more at the end. Scratch: one buffer (two with compression).
    """
    n, r = ctx.size, ctx.rank
    if n == 1:
        return
    wire = compressed(ctx, buf.dtype, op)
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    unfold_step = p.bit_length()  # fold is step 0, the rounds are steps 1 .. log2(p)
    if r < 2 * extra and r % 2 == 0:
        send_chunked(ctx, r + 1, buf, 0, wire)
        recv_chunked(ctx, r + 1, buf, unfold_step, wire)
        return
    incoming = scratch(ctx, "incoming", buf.size, buf.dtype if wire is None else wire)
    if r < 2 * extra:
        _exchange(ctx, None, r - 1, buf, incoming, 0, op, wire, partner_first=True)
        virtual = r // 2
    else:
        virtual = r - extra
    mask, step = 1, 1
    while mask < p:
        partner_virtual = virtual ^ mask
        partner = 2 * partner_virtual + 1 if partner_virtual < extra else partner_virtual + extra
        _exchange(ctx, partner, partner, buf, incoming, step, op, wire,
                  partner_first=partner_virtual < virtual)
        mask, step = mask * 2, step + 1
    if wire is not None:
        round_to(wire, buf)
    if r < 2 * extra:
        send_chunked(ctx, r - 1, buf, unfold_step, wire)


def _exchange(ctx: Ctx, dst: int | None, src: int, buf: np.ndarray, incoming: np.ndarray, step: int,
              op: ReduceOp, wire: np.dtype | None, partner_first: bool) -> None:
    """Send ``buf`` to ``dst`` (None: send nothing) while receiving ``src``'s into ``incoming``,
    chunk by chunk, and combine each chunk into ``buf`` as it arrives (the partner's value is the
    left operand when ``partner_first``)."""
    pieces = spans(0, buf.size, chunk_elements(incoming.itemsize))
    outgoing = buf
    if wire is not None and dst is not None:
        outgoing = scratch(ctx, "outgoing", buf.size, wire)
        outgoing[...] = buf
        buf[...] = outgoing  # both partners combine the same two rounded values
    receiving = [ctx.irecv(src, incoming[lo:hi], step) for lo, hi in pieces]
    sending = [] if dst is None else [ctx.isend(dst, outgoing[lo:hi], step) for lo, hi in pieces]
    widened = None if wire is None else scratch(ctx, "widened", pieces[0][1], buf.dtype)
    for index, ((lo, hi), request) in enumerate(zip(pieces, receiving, strict=True)):
        ctx.wait(request)
        if sending and outgoing is buf:
            ctx.wait(sending[index])  # buf[lo:hi] changes next: its send must be out
        theirs = incoming[lo:hi]
        if widened is not None:
            theirs = widened[:hi - lo]
            theirs[...] = incoming[lo:hi]
        mine = buf[lo:hi]
        if partner_first:
            combine(op, theirs, mine, mine)
        else:
            combine(op, mine, theirs, mine)
    for request in sending:
        ctx.wait(request)
