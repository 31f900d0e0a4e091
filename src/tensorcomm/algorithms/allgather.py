"""All-gather algorithms: ring (bandwidth-optimal) and Bruck (log latency), both the "v" variant.

Also owns the block-layout helpers (``bounds``, ``even_counts``) and the in-place ring pass that
allreduce and broadcast reuse. Algorithms talk through ``Ctx`` only; this module must not import
``core``. Buffers are 1-D, C-contiguous numpy arrays; sizes are in elements.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import numpy as np

from .base import Ctx
from .wire import chunk_elements, scratch, spans


def bounds(counts: Sequence[int]) -> list[int]:
    """Block offsets of ``counts`` laid out back to back: block i is ``[b[i], b[i+1])``."""
    return [0, *accumulate(counts)]


def even_counts(total: int, parts: int) -> list[int]:
    """Split ``total`` elements into ``parts`` blocks whose sizes differ by at most one."""
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


def ring_inplace(ctx: Ctx, buf: np.ndarray, offsets: Sequence[int], shift: int = 0,
                 step_base: int = 0, wire: np.dtype | None = None) -> None:
    """Ring all-gather inside ``buf``, whose block i is ``buf[offsets[i]:offsets[i+1]]``.

    On entry group rank r holds block ``(r - shift) % size``; on return every rank holds every
    block. Blocks travel in chunks (see ``wire``): every receive is posted at once and lands in
    place, and each chunk is passed on as soon as it is in, so a block need not arrive whole
    before it moves on. ``wire``: a dtype the blocks travel as (their values must already be
    exact in it: all-reduce rounds them first). Uses steps ``step_base .. step_base + size - 2``.
    """
    n, r = ctx.size, ctx.rank
    if n == 1:
        return
    right, left = (r + 1) % n, (r - 1) % n
    # With a wire dtype, blocks travel through a packed copy of the buffer and are widened into
    # ``buf`` as they arrive.
    carrier = buf if wire is None else scratch(ctx, "carrier", buf.size, wire)
    chunk = chunk_elements(carrier.itemsize)
    own = (r - shift) % n
    if wire is not None:
        carrier[offsets[own]:offsets[own + 1]] = buf[offsets[own]:offsets[own + 1]]

    def pieces(block: int) -> list[tuple[int, int]]:
        return spans(offsets[block], offsets[block + 1], chunk)

    # Message m carries block (r - shift - m) % n rightwards; the left neighbour's message m is
    # block (r - shift - m - 1) % n.
    receiving = [[ctx.irecv(left, carrier[lo:hi], step_base + m) for lo, hi in pieces((own - m - 1) % n)]
                 for m in range(n - 1)]
    sending = [ctx.isend(right, carrier[lo:hi], step_base) for lo, hi in pieces(own)]
    for m in range(n - 1):
        for (lo, hi), request in zip(pieces((own - m - 1) % n), receiving[m], strict=True):
            ctx.wait(request)
            if m < n - 2:
                sending.append(ctx.isend(right, carrier[lo:hi], step_base + m + 1))
            if wire is not None:
                buf[lo:hi] = carrier[lo:hi]
    for request in sending:
        ctx.wait(request)


def ring(ctx: Ctx, send: np.ndarray, out: np.ndarray, counts: Sequence[int]) -> None:
    """Gather every rank's ``send`` into ``out`` in rank order, passing blocks around a ring.

    Args:
        ctx: the call's group view.
        send: this rank's ``counts[ctx.rank]`` elements.
        out: ``sum(counts)`` elements; block i receives rank i's ``send``.
        counts: elements contributed by each rank (may differ per rank).
    """
    offsets = bounds(counts)
    out[offsets[ctx.rank]:offsets[ctx.rank + 1]] = send
    ring_inplace(ctx, out, offsets)


def bruck(ctx: Ctx, send: np.ndarray, out: np.ndarray, counts: Sequence[int]) -> None:
    """Gather every rank's ``send`` into ``out`` in ceil(log2 size) steps (Bruck et al., 1997).

    Rank r collects blocks in rotated order (its own first) in a scratch buffer: at the step with
    distance d it sends the first min(d, size - d) blocks it holds to rank r - d and appends what
    rank r + d sends. One rotation into ``out`` ends the call. Arguments as ``ring``.
    """
    n, r = ctx.size, ctx.rank
    rotated = bounds([*counts[r:], *counts[:r]])
    rotated_blocks = scratch(ctx, "bruck", rotated[-1], out.dtype)
    rotated_blocks[:rotated[1]] = send
    distance, step = 1, 0
    while distance < n:
        blocks = min(distance, n - distance)
        ctx.sendrecv((r - distance) % n, rotated_blocks[:rotated[blocks]],
                     (r + distance) % n, rotated_blocks[rotated[distance]:rotated[distance + blocks]], step)
        distance, step = distance * 2, step + 1
    own = bounds(counts)[r]
    tail = rotated[-1] - own  # elements of blocks r..size-1, which come first in scratch
    out[own:] = rotated_blocks[:tail]
    out[:own] = rotated_blocks[tail:]
