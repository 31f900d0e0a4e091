"""Reduce to one root: the binomial tree.

Algorithms talk through ``Ctx`` only; this module must not import ``core``. Buffers are 1-D,
C-contiguous numpy arrays already in the accumulation dtype (see ``kernels.prepare``).
"""

from __future__ import annotations

import numpy as np

from ..types import ReduceOp
from .base import Ctx
from .kernels import combine


def binomial_tree(ctx: Ctx, send: np.ndarray, out: np.ndarray | None, root: int,
                  op: ReduceOp) -> None:
    """Reduce every rank's ``send`` into ``out`` on ``root`` along a binomial tree.

    Relative rank v = (rank - root) mod size combines, for k = 0, 1, ..., the partial of
    v + 2^k into its own (its partial on the left) until bit k of v is set, then sends its partial
    to v - 2^k. The reduction order is therefore fixed by the ranks relative to the root, whatever
    the timing. ``send`` is not modified; leaves send it without copying.

    Args:
        ctx: the call's group view.
        send: this rank's contribution.
        out: same size as ``send`` on the root (may be ``send`` itself); ``None`` elsewhere.
        root: group rank that receives the result.
        op: a base op (SUM, PROD, MIN, MAX, BAND, BOR, BXOR).
    """
    n = ctx.size
    relative = (ctx.rank - root) % n
    partial, incoming, target = send, None, out
    mask = 1
    while mask < n:
        if relative & mask:
            parent = (relative - mask + root) % n
            ctx.send(parent, partial, step=mask.bit_length() - 1)
            if incoming is None:  # a leaf received nothing: its parent confirms the call
                ctx.acknowledged([parent])
            return
        if relative + mask < n:
            if incoming is None:  # first child: now this rank needs scratch
                incoming = np.empty_like(send)
                if relative:
                    target = np.empty_like(send)
            assert target is not None  # the root's ``out``, or the scratch made above
            child = (relative + mask + root) % n
            ctx.recv(child, incoming, step=mask.bit_length() - 1)
            if mask == 1 or relative + mask + 1 >= n:  # a leaf: it has no child of its own
                ctx.acknowledge(child)
            combine(op, partial, incoming, target)
            partial = target
        mask *= 2
    assert out is not None  # only the root gets here
    if partial is not out:  # a root with nothing to receive: size 1
        out[...] = send
