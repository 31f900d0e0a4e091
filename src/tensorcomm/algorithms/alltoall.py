"""All-to-all with per-rank block sizes: pairwise exchange, every block posted at once.

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

    Rank r posts every receive (from r - k, mod size, k = 1 .. size-1), then every send (to
    r + k), in one transport call (``Ctx.exchange``: one lock, one request for them all; one tag,
    since each pair exchanges one block each way), then waits for them; the own block is
    copied. As Gloo's
    all-to-all, nothing waits for one peer before the next is served: a blocking step per peer
    (send to one, receive from one, wait) made the call grow with n times the slowest
    turn-around. The transport moves the queued sends and the arriving blocks together, straight
    into ``out`` (the receives are posted first), so the call holds no copy beyond the caller's
    buffers (a sealed link's encryption aside). A failed request fails the call, naming its peer,
    as ``Ctx.wait`` does.

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
    sources = [(r - k) % n for k in range(1, n)]
    targets = [(r + k) % n for k in range(1, n)]
    ctx.wait(ctx.exchange([(q, out[received[q]:received[q + 1]]) for q in sources],
                          [(q, send[sent[q]:sent[q + 1]]) for q in targets]))
