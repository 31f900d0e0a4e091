"""Same-host broadcast and scatter: one member publishes, the others copy from its slot.

The root publishes one slot per round (``shm_common.run_rounds``); every other member copies its
share of the round straight into its array. Broadcast overwrites the caller's tensor in place, so
when that takes more than one round a ``Journal`` keeps the array's old bytes and a failed call
leaves it untouched; scatter's tensor is an output only, so a failed multi-round scatter may leave
it partly written. This module must not import ``core``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .allgather import bounds
from .base import Ctx
from .shm_common import Journal, Stream, no_domain, run_rounds


def broadcast(ctx: Ctx, buf: np.ndarray, root: int) -> None:
    """Copy group rank ``root``'s ``buf`` into every member's ``buf`` (1-D, C-contiguous)."""
    d = ctx.team.shm
    if d is None:
        raise no_domain(ctx)
    key = ("broadcast", ctx.signature)
    views = d.memo.get(key)
    if views is None:  # per slot parity, the root's slot as a typed view; False: several rounds
        views = d.remember(key, buf.nbytes <= d.slot_bytes and tuple(
            d.inbox[root][p][:buf.nbytes].view(buf.dtype) for p in (0, 1)))
    if views is not False:  # one round, the root's slot read in place
        rounds = d.round
        if d.rank == root:
            views[rounds & 1][...] = buf
        d.start(ctx, None)  # nobody reads extents in one round
        d.round = rounds + 1
        if d.rank != root:
            buf[...] = views[rounds & 1]
        return
    if d.rank == root:
        run_rounds(ctx, Stream.of([buf]), lambda parity, lo, hi, journal: None)
        return
    raw = buf.view(np.uint8)
    source = d.inbox[root]

    def read(parity: int, lo: int, hi: int, journal: Journal | None) -> None:
        b = min(hi, raw.size)
        if lo < b:
            if journal is not None:
                journal.save(0, lo, b)
            raw[lo:b] = source[parity][:b - lo]

    run_rounds(ctx, Stream.of([]), read, [buf])


def scatter(ctx: Ctx, out: np.ndarray, inputs: Sequence[np.ndarray] | None, counts: Sequence[int],
            root: int) -> None:
    """Copy ``inputs[i]`` of group rank ``root`` into member ``i``'s ``out``.

    Args:
        out: this member's 1-D array of ``counts[ctx.rank]`` elements.
        inputs: on ``root``, one array per member; None elsewhere.
        counts: elements each member receives (the same list on every member).
        root: the group rank that sends.
    """
    d = ctx.team.shm
    if d is None:
        raise no_domain(ctx)
    key = ("scatter", ctx.signature, tuple(counts))
    views = d.memo.get(key)
    if views is None:  # per slot parity, the root's slot cut into typed blocks; False: rounds
        itemsize, starts = out.itemsize, bounds(counts)
        views = d.remember(key, starts[-1] * itemsize <= d.slot_bytes and tuple(
            tuple(d.inbox[root][p][starts[q] * itemsize:starts[q + 1] * itemsize].view(out.dtype)
                  for q in range(d.size)) for p in (0, 1)))
    if views is not False:  # one round, the root's slot read in place
        rounds = d.round
        blocks = views[rounds & 1]
        if d.rank == root:
            assert inputs is not None
            for q in d.peers:
                blocks[q][...] = inputs[q]
        d.start(ctx, None)  # nobody reads extents in one round
        d.round = rounds + 1
        out[...] = blocks[d.rank] if d.rank != root else inputs[root]  # type: ignore[index]
        return
    if d.rank == root:
        assert inputs is not None
        run_rounds(ctx, Stream.of(inputs, skip=root), lambda parity, lo, hi, journal: None)
        out[...] = inputs[root]
        return
    offsets = bounds([c * out.itemsize for c in counts])
    start, stop = offsets[d.rank], offsets[d.rank + 1]
    raw = out.view(np.uint8)
    source = d.inbox[root]

    def read(parity: int, lo: int, hi: int, journal: Journal | None) -> None:
        a, b = max(lo, start), min(hi, stop)
        if a < b:
            if journal is not None:
                journal.save(0, a - start, b - start)
            raw[a - start:b - start] = source[parity][a - lo:b - lo]

    run_rounds(ctx, Stream.of([]), read)  # ``out`` is an output only: no journal
