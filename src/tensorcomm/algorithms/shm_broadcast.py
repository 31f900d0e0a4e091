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
