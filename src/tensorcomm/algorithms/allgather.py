"""All-gather algorithms: ring (bandwidth-optimal) and Bruck (log latency), both the "v" variant.

Also owns the block-layout helpers (``bounds``, ``even_counts``) and the in-place ring pass that
allreduce and broadcast reuse. Algorithms talk through ``Ctx`` only; this module must not import
``core``. Buffers are 1-D, C-contiguous numpy arrays; sizes are in elements.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Sequence

import numpy as np

from .base import Ctx


def bounds(counts: Sequence[int]) -> list[int]:
    """Block offsets of ``counts`` laid out back to back: block i is ``[b[i], b[i+1])``."""
    return [0, *accumulate(counts)]


def even_counts(total: int, parts: int) -> list[int]:
    """Split ``total`` elements into ``parts`` blocks whose sizes differ by at most one."""
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


def ring_inplace(ctx: Ctx, buf: np.ndarray, offsets: Sequence[int], shift: int = 0,
                 step_base: int = 0) -> None:
    """Ring all-gather inside ``buf``, whose block i is ``buf[offsets[i]:offsets[i+1]]``.

    On entry group rank r holds block ``(r - shift) % size``; on return every rank holds every
    block. Uses steps ``step_base .. step_base + size - 2``.
    """
    n, r = ctx.size, ctx.rank
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        out_block = (r - shift - s) % n
        in_block = (out_block - 1) % n  # what the left neighbour sends at this step
        ctx.sendrecv(right, buf[offsets[out_block]:offsets[out_block + 1]],
                     left, buf[offsets[in_block]:offsets[in_block + 1]], step_base + s)


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
    scratch = np.empty(rotated[-1], dtype=out.dtype)
    scratch[:rotated[1]] = send
    distance, step = 1, 0
    while distance < n:
        blocks = min(distance, n - distance)
        ctx.sendrecv((r - distance) % n, scratch[:rotated[blocks]],
                     (r + distance) % n, scratch[rotated[distance]:rotated[distance + blocks]], step)
        distance, step = distance * 2, step + 1
    own = bounds(counts)[r]
    tail = rotated[-1] - own  # elements of blocks r..size-1, which come first in scratch
    out[own:] = scratch[:tail]
    out[:own] = scratch[tail:]
