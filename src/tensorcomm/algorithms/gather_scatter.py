"""Gather to one root and scatter from one root: linear algorithms.

The root posts every transfer at once and the transport overlaps them; with n - 1 messages
either way, a tree would only save latency at the root. Algorithms talk through ``Ctx`` only;
this module must not import ``core``. Buffers are 1-D, C-contiguous numpy arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .allgather import bounds
from .base import Ctx


def gather(ctx: Ctx, send: np.ndarray, out: np.ndarray | None, counts: Sequence[int],
           root: int) -> None:
    """Collect every rank's ``send`` into ``out`` on ``root``, in rank order.

    Args:
        ctx: the call's group view.
        send: this rank's ``counts[ctx.rank]`` elements.
        out: ``sum(counts)`` elements on the root; ``None`` elsewhere.
        counts: elements contributed by each rank.
        root: group rank that receives.
    """
    if ctx.rank != root:
        ctx.send(root, send)
        ctx.acknowledged([root])  # received nothing: the root confirms it made this call
        return
    assert out is not None  # the frontends give the root an output
    offsets = bounds(counts)
    peers = [peer for peer in range(ctx.size) if peer != root]
    pending = [ctx.irecv(peer, out[offsets[peer]:offsets[peer + 1]]) for peer in peers]
    out[offsets[root]:offsets[root + 1]] = send
    for request in pending:
        ctx.wait(request)
    for peer in peers:
        ctx.acknowledge(peer)


def scatter(ctx: Ctx, send: np.ndarray | None, out: np.ndarray, counts: Sequence[int],
            root: int) -> None:
    """Send block i of the root's ``send`` to rank i's ``out``.

    Args:
        ctx: the call's group view.
        send: ``sum(counts)`` elements on the root, block i for rank i; ``None`` elsewhere.
        out: this rank's ``counts[ctx.rank]`` elements.
        counts: block sizes per rank.
        root: group rank that sends.
    """
    if ctx.rank != root:
        ctx.recv(root, out)
        ctx.acknowledge(root)
        return
    assert send is not None  # the frontends give the root an input
    offsets = bounds(counts)
    peers = [peer for peer in range(ctx.size) if peer != root]
    pending = [ctx.isend(peer, send[offsets[peer]:offsets[peer + 1]]) for peer in peers]
    out[...] = send[offsets[root]:offsets[root + 1]]
    for request in pending:
        ctx.wait(request)
    ctx.acknowledged(peers)  # received nothing: every peer confirms it made this call
