"""Broadcast algorithms: binomial tree (log latency) and scatter + all-gather (van de Geijn).

Algorithms talk through ``Ctx`` only; this module must not import ``core``. Buffers are 1-D,
C-contiguous numpy arrays; the root's ``buf`` is the source, everyone else's is overwritten.
"""

from __future__ import annotations

import numpy as np

from .allgather import bounds, even_counts, ring_inplace
from .base import Ctx
from .wire import chunk_elements, spans


def _parent_mask(relative: int, size: int) -> int:
    """Distance from ``relative`` to its tree parent, i.e. its lowest set bit.

    For the root (0) it is ``size`` rounded up to a power of two, so that halving it repeatedly
    yields the distances to the root's children.
    """
    mask = 1
    while mask < size and not relative & mask:
        mask *= 2
    return mask


def binomial_tree(ctx: Ctx, buf: np.ndarray, root: int) -> None:
    """Copy the root's ``buf`` to every rank along a binomial tree rooted at ``root``.

    Relative rank v = (rank - root) mod size receives from v - lowbit(v) and then sends to
    v + 2^k for every 2^k < lowbit(v), largest subtree first. ceil(log2 size) rounds. The buffer
    travels in chunks (``wire``), each passed on to the children as soon as it is in, so a large
    broadcast flows down the tree as a pipeline instead of waiting a whole message per level.
    """
    n = ctx.size
    relative = (ctx.rank - root) % n
    mask = _parent_mask(relative, n)
    parent = (relative - mask + root) % n
    pieces = spans(0, buf.size, chunk_elements(buf.itemsize))
    receiving = [ctx.irecv(parent, buf[lo:hi], step=mask.bit_length() - 1)
                 for lo, hi in pieces] if relative else []
    children = []
    mask //= 2
    while mask:
        if relative + mask < n:
            children.append(((relative + mask + root) % n, mask.bit_length() - 1))
        mask //= 2
    pending = []
    for index, (lo, hi) in enumerate(pieces):
        if receiving:
            ctx.wait(receiving[index])
        pending += [ctx.isend(child, buf[lo:hi], step=step) for child, step in children]
    for request in pending:
        ctx.wait(request)
    if not relative:  # the root received nothing: its children confirm they made this call
        ctx.acknowledged([child for child, _ in children])
    elif parent == root:
        ctx.acknowledge(root)


def scatter_allgather(ctx: Ctx, buf: np.ndarray, root: int) -> None:
    """Scatter ``size`` blocks of ``buf`` down a binomial tree, then ring all-gather them.

    Relative rank v ends the scatter holding block v; every rank sends and receives about
    2 * nbytes in total, instead of log2(size) * nbytes at the root of a binomial tree.
    """
    n = ctx.size
    if n == 1:
        return
    relative = (ctx.rank - root) % n
    offsets = bounds(even_counts(buf.size, n))
    mask = _parent_mask(relative, n)
    if relative:
        # A subtree rooted at v covers relative ranks v .. v + lowbit(v) - 1: receive their blocks.
        end = offsets[min(relative + mask, n)]
        ctx.recv((relative - mask + root) % n, buf[offsets[relative]:end], step=mask.bit_length() - 1)
    pending = []
    mask //= 2
    while mask:
        child = relative + mask
        if child < n:
            part = buf[offsets[child]:offsets[min(child + mask, n)]]
            pending.append(ctx.isend((child + root) % n, part, step=mask.bit_length() - 1))
        mask //= 2
    for request in pending:
        ctx.wait(request)
    ring_inplace(ctx, buf, offsets, shift=root, step_base=n.bit_length())
