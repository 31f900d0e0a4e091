"""Same-host all-to-all with per-pair block sizes: every member copies its block from each peer.

A member's stream is a header (the byte offset of each destination's block, as int64) followed by
its input; peers read every member's header in the first round, all at once (a strided view of
the headers of all the slots), check the size of the block they get against the size they
expect, and copy their block out of the rounds that carry it. When the call takes one round and
every member put this member's block at the same offset (blocks of one size), all blocks come
out with one numpy call. Outputs only: a call that fails after its first round may leave them
partly written. This module must not import ``core``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import CollectiveMismatchError
from .allgather import bounds
from .base import Ctx
from .shm_common import Journal, Stream, no_domain, run_rounds


def _state(ctx: Ctx, send: np.ndarray, send_counts: Sequence[int],
           recv_counts: Sequence[int]) -> tuple[Any, ...]:
    """Per call shape: this member's header; per slot parity every member's header as one
    ``(members, members + 1)`` array; the block sizes to expect; and, when this member gets
    blocks of one size, per slot parity its block of every slot as one array, at the offset where
    blocks of that size would be."""
    d = ctx.team.shm
    if d is None:
        raise no_domain(ctx)
    n, r, itemsize = d.size, d.rank, send.itemsize
    offsets = np.array([o * itemsize for o in bounds(send_counts)], dtype=np.int64)
    header_bytes = -(-offsets.nbytes // 64) * 64
    header = np.zeros(header_bytes, dtype=np.uint8)
    header[:offsets.nbytes] = offsets.view(np.uint8)
    headers = tuple(d.stacked(p, np.dtype(np.int64), n + 1) for p in (0, 1))
    expected = [count * itemsize for count in recv_counts]
    count = recv_counts[0]
    uniform = None
    if len(set(recv_counts)) == 1 and header_bytes + n * count * itemsize <= d.slot_bytes:
        start = r * count * itemsize
        uniform = ([[start, start + count * itemsize]] * n,
                   tuple(d.stacked(p, send.dtype, count, offset=header_bytes + start) for p in (0, 1)))
    return header, header_bytes, headers, expected, bounds(send_counts), bounds(recv_counts), uniform


def all_to_all(ctx: Ctx, send: np.ndarray, send_counts: Sequence[int], out: np.ndarray,
               recv_counts: Sequence[int]) -> None:
    """Block ``j`` of member ``i``'s ``send`` lands in block ``i`` of member ``j``'s ``out``.

    Args:
        send: 1-D, ``sum(send_counts)`` elements, block ``j`` for member ``j``.
        send_counts: elements this member sends each member.
        out: 1-D, ``sum(recv_counts)`` elements, block ``i`` from member ``i``.
        recv_counts: elements this member receives from each member.
    """
    plan = ctx.plan
    if plan.state is None:
        plan.state = _state(ctx, send, send_counts, recv_counts)
    header, header_bytes, headers, expected, send_offsets, recv_offsets, uniform = plan.state
    d = ctx.team.shm
    r, itemsize = d.rank, out.itemsize
    raw = out.view(np.uint8)
    taken: list[tuple[int, int, int]] = []  # (peer, start, stop) of this member's block in its stream
    whole: list[np.ndarray] = []  # the one-call view of every block, when it applies

    def verify(parity: int, extents: list[int]) -> None:
        pairs = headers[parity][:, r:r + 2].tolist()  # where each member's block for r lies
        if uniform is not None and pairs == uniform[0] and max(extents) <= d.slot_bytes:
            whole.append(uniform[1][parity])
            return
        sizes = [stop - start for start, stop in pairs]
        if sizes != expected:
            q = next(q for q, size in enumerate(sizes) if size != expected[q])
            raise CollectiveMismatchError(
                f"rank {d.global_ranks[q]} called {ctx.name} sending {sizes[q] // itemsize} "
                f"elements to rank {d.global_ranks[r]}, which called it expecting "
                f"{expected[q] // itemsize}, at step {ctx.seq}")
        for q in d.peers:
            start = pairs[q][0] + header_bytes
            taken.append((q, start, start + sizes[q]))

    def read(parity: int, lo: int, hi: int, journal: Journal | None) -> None:
        if whole:
            blocks, slots = out.reshape(d.size, -1), whole[0]  # the peers' blocks, around r's
            blocks[:r] = slots[:r]
            blocks[r + 1:] = slots[r + 1:]
            return
        for q, start, stop in taken:
            a, b = max(lo, start), min(hi, stop)
            if a < b:
                base = recv_offsets[q] * itemsize
                raw[base + a - start:base + b - start] = d.inbox[q][parity][a - lo:b - lo]

    run_rounds(ctx, Stream.of([send], start=header_bytes), read, verify=verify, header=header)
    out[recv_offsets[r]:recv_offsets[r + 1]] = send[send_offsets[r]:send_offsets[r + 1]]
