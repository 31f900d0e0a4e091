"""Same-host all-to-all with per-pair block sizes: every member copies its block from each peer.

A member's stream is a header (the byte offset of each destination's block) followed by its
blocks; peers read the header in the first round, check the block they get against the size they
expect, and copy their block out of the rounds that carry it. A member's block for itself never
travels. Outputs only: a call that fails after its first round may leave them partly written.
This module must not import ``core``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import CollectiveMismatchError
from .allgather import bounds
from .base import Ctx
from .shm_common import Journal, Stream, no_domain, run_rounds


def _setup(d, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> tuple:  # type: ignore[no-untyped-def,type-arg]
    """Per call shape (kept in the domain's memo): this member's header (the byte offset of its
    block for each member, padded to a cache line) and, per slot parity, every peer's header as
    int64 views of its slot."""
    offsets = np.array(bounds([i.nbytes for i in inputs]), dtype=np.int64)
    header_bytes = -(-offsets.nbytes // 64) * 64
    header = np.zeros(header_bytes, dtype=np.uint8)
    header[:offsets.nbytes] = offsets.view(np.uint8)
    theirs = tuple(tuple((q, d.inbox[q][p][:offsets.nbytes].view(np.int64)) for q in d.peers)
                   for p in (0, 1))
    return header, header_bytes, theirs


def alltoall(ctx: Ctx, outputs: Sequence[np.ndarray], inputs: Sequence[np.ndarray]) -> None:
    """``inputs[j]`` of member ``i`` lands in ``outputs[i]`` of member ``j``.

    Args:
        outputs: one 1-D, C-contiguous array per member: what that member sends here.
        inputs: one 1-D array per member: what this member sends there.
    """
    d = ctx.team.shm
    if d is None:
        raise no_domain(ctx)
    r = d.rank
    key = ("alltoall", ctx.signature, tuple(i.size for i in inputs), tuple(o.size for o in outputs))
    setup = d.memo.get(key)
    if setup is None:
        setup = d.remember(key, _setup(d, inputs, outputs))
    header, header_bytes, theirs = setup
    blocks: dict[int, tuple[int, int]] = {}
    raw = [o.view(np.uint8) for o in outputs]

    def verify(extents: list[int]) -> None:
        for q, offsets in theirs[d.round & 1]:
            start, stop = int(offsets[r]) + header_bytes, int(offsets[r + 1]) + header_bytes
            if stop - start != raw[q].size:
                itemsize = outputs[q].itemsize
                raise CollectiveMismatchError(
                    f"rank {d.global_ranks[q]} called {ctx.name} sending {(stop - start) // itemsize} "
                    f"elements to rank {d.global_ranks[r]}, which called it expecting "
                    f"{outputs[q].size}, at step {ctx.seq}")
            blocks[q] = (start, stop)

    def read(parity: int, lo: int, hi: int, journal: Journal | None) -> None:
        for q, (start, stop) in blocks.items():
            a, b = max(lo, start), min(hi, stop)
            if a < b:
                if journal is not None:
                    journal.save(q, a - start, b - start)
                raw[q][a - start:b - start] = d.inbox[q][parity][a - lo:b - lo]

    run_rounds(ctx, Stream.of(inputs, start=header_bytes, skip=r), read, verify=verify, header=header)
    outputs[r][...] = inputs[r]
