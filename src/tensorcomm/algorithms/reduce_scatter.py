"""Reduce-scatter: the ring algorithm, also the first half of ring all-reduce.

Algorithms talk through ``Ctx`` only; this module must not import ``core``. Buffers are 1-D,
C-contiguous numpy arrays already in the accumulation dtype (see ``kernels.prepare``); sizes are
in elements.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np

from ..types import ReduceOp
from .allgather import bounds
from .base import Ctx, Request
from .kernels import combine
from .wire import chunk_elements, compressed, scratch, spans


def ring_reduce(ctx: Ctx, send: np.ndarray, offsets: Sequence[int], op: ReduceOp,
                out: np.ndarray, step_base: int = 0) -> None:
    """Reduce block i (``send[offsets[i]:offsets[i+1]]``) of every rank into ``out`` on rank i.

    Block b starts at rank b + 1 and travels the ring rightwards; each rank combines what it
    receives (left operand) with its own block b (right operand) and passes the partial on, so
    block b is reduced in one place, in one fixed order: ``((x[b+1] op x[b+2]) op ...) op x[b]``.
    Blocks travel in chunks (``wire``), each passed on as soon as it is combined, so the ring is
    a pipeline rather than ``size - 1`` rounds that each wait for a whole block; with wire
    compression on, partials travel rounded to the wire dtype (sums stay float32). ``send`` is
    only read, except that ``out`` may be rank r's own block of ``send`` (ring all-reduce), which
    is read for the last time when it is written. Scratch: four blocks (two in, two out), one
    chunk more with compression. Uses steps ``step_base .. step_base + size - 2``.
    """
    n, r = ctx.size, ctx.rank
    if n == 1:
        out[...] = send[offsets[0]:offsets[1]]
        return
    right, left = (r + 1) % n, (r - 1) % n
    wire = compressed(ctx, send.dtype, op)
    carried = send.dtype if wire is None else wire
    chunk = chunk_elements(carried.itemsize)
    widest = max(hi - lo for lo, hi in pairwise(offsets))
    inbox = [scratch(ctx, f"inbox{i}", widest, carried) for i in range(min(2, n - 1))]
    # Message m carries block (r - 1 - m) % n rightwards: this rank's own block for m = 0, then
    # the partial made from the left neighbour's message m - 1, kept in outbox[m % 2].
    outboxes = 2 if n > 2 else int(wire is not None)
    outbox = [scratch(ctx, f"outbox{i}", widest, carried) for i in range(outboxes)]
    widened = None if wire is None else scratch(ctx, "widened", min(chunk, widest), send.dtype)

    def pieces(block: int) -> list[tuple[int, int]]:
        return spans(0, offsets[block + 1] - offsets[block], chunk)

    def post(m: int) -> list[Request]:
        block = (r - m - 2) % n  # what the left neighbour sends as its message m
        return [ctx.irecv(left, inbox[m % 2][lo:hi], step_base + m) for lo, hi in pieces(block)]

    first = (r - 1) % n
    mine = send[offsets[first]:offsets[first + 1]]
    if wire is not None:
        outbox[0][:mine.size] = mine
        mine = outbox[0][:mine.size]
    receiving = post(0)
    sending: list[list[Request]] = [[ctx.isend(right, mine[lo:hi], step_base)
                                     for lo, hi in pieces(first)], []]
    for m in range(n - 1):
        last = m == n - 2
        upcoming = [] if last else post(m + 1)
        block = (r - m - 2) % n
        base = offsets[block]
        if not last:
            for request in sending[(m + 1) % 2]:  # message m - 1 still owns that outbox
                ctx.wait(request)
            sending[(m + 1) % 2] = []
        for (lo, hi), request in zip(pieces(block), receiving, strict=True):
            ctx.wait(request)
            theirs = inbox[m % 2][lo:hi]
            target = out[lo:hi] if last else outbox[(m + 1) % 2][lo:hi]
            if widened is None:
                combine(op, theirs, send[base + lo:base + hi], target)
            else:
                partial = widened[:hi - lo]
                partial[...] = theirs
                combine(op, partial, send[base + lo:base + hi], partial)
                target[...] = partial
            if not last:
                sending[(m + 1) % 2].append(ctx.isend(right, target, step_base + m + 1))
        receiving = upcoming
    for request in sending[0] + sending[1]:
        ctx.wait(request)


def ring(ctx: Ctx, send: np.ndarray, out: np.ndarray, counts: Sequence[int], op: ReduceOp) -> None:
    """Reduce every rank's ``send`` element-wise and leave block ``ctx.rank`` of it in ``out``.

    Args:
        ctx: the call's group view.
        send: ``sum(counts)`` elements, block i (``counts[i]`` elements) destined for rank i;
            not modified.
        out: ``counts[ctx.rank]`` elements.
        counts: block sizes per rank.
        op: a base op (SUM, PROD, MIN, MAX, BAND, BOR, BXOR).
    """
    ring_reduce(ctx, send, bounds(counts), op, out)
