"""All-to-all with per-rank block sizes: pairwise exchange.

Algorithms talk through ``Ctx`` only; this module must not import ``core``. Buffers are 1-D,
C-contiguous numpy arrays; sizes are in elements.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .allgather import bounds
from .base import Ctx


def pairwise_exchange(ctx: Ctx, send: np.ndarray, send_counts: Sequence[int], out: np.ndarray,
                      recv_counts: Sequence[int]) -> None:
    """Send block i of ``send`` to rank i and receive rank i's block for us into block i of ``out``.

    At step k = 1 .. size-1 rank r sends to r + k and receives from r - k (mod size), so every
    rank talks to one peer at a time and each pair meets exactly once; the own block is copied.

    Args:
        ctx: the call's group view.
        send: ``sum(send_counts)`` elements, block i (``send_counts[i]`` elements) for rank i.
        send_counts: elements this rank sends to each rank.
        out: ``sum(recv_counts)`` elements, block i from rank i.
        recv_counts: elements this rank receives from each rank.
    """
    n, r = ctx.size, ctx.rank
    sent, received = bounds(send_counts), bounds(recv_counts)
    out[received[r]:received[r + 1]] = send[sent[r]:sent[r + 1]]
    for k in range(1, n):
        dst, src = (r + k) % n, (r - k) % n
        ctx.sendrecv(dst, send[sent[dst]:sent[dst + 1]], src, out[received[src]:received[src + 1]], k)
