"""Barrier: the dissemination algorithm (Hensgen, Finkel and Manber, 1988).

Algorithms talk through ``Ctx`` only; this module must not import ``core``.
"""

from __future__ import annotations

import numpy as np

from .base import Ctx


def dissemination(ctx: Ctx) -> None:
    """Return once every rank of the group has entered the barrier.

    In round k rank r sends one byte to r + 2^k and waits for one from r - 2^k; after
    ceil(log2 size) rounds every rank has heard, directly or not, from every other.
    """
    n, r = ctx.size, ctx.rank
    token, sink = np.zeros(1, dtype=np.uint8), np.empty(1, dtype=np.uint8)
    distance, step = 1, 0
    while distance < n:
        ctx.sendrecv((r + distance) % n, token, (r - distance) % n, sink, step)
        distance, step = distance * 2, step + 1
