"""Same-host all-gather and gather: members copy their peers' slots straight into their outputs.

Every member publishes its array one slot per round (``shm_common.run_rounds``); a reader copies
each peer's bytes of the round into its output for that peer and its own array last, once nothing
can fail any more. Contributions may differ in size per member (the "v" variant); each member
checks the sizes its peers announce against its own outputs. The outputs are outputs only, so a
call that fails after its first round may leave them partly written (no journal: see
``shm_common.Journal``). This module must not import ``core``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import CollectiveMismatchError
from .base import Ctx
from .shm_common import Journal, Stream, no_domain, run_rounds


def _check_sizes(ctx: Ctx, outputs: Sequence[np.ndarray], senders: Sequence[int]) -> None:
    d = ctx.team.shm
    if d is None:
        raise no_domain(ctx)
    for q in senders:
        if d.extent(q, ctx) != outputs[q].nbytes:
            itemsize = outputs[q].itemsize
            raise CollectiveMismatchError(
                f"rank {d.global_ranks[q]} called {ctx.name} with {d.extent(q, ctx) // itemsize} "
                f"elements, while rank {d.global_ranks[d.rank]} called it expecting "
                f"{outputs[q].size} from rank {d.global_ranks[q]}, at step {ctx.seq}")


def _copy_peers(ctx: Ctx, outputs: Sequence[np.ndarray], senders: Sequence[int]):  # type: ignore[no-untyped-def]
    d = ctx.team.shm
    if d is None:
        raise no_domain(ctx)
    raw = [o.view(np.uint8) for o in outputs]

    def read(parity: int, lo: int, hi: int, journal: Journal | None) -> None:
        for q in senders:
            b = min(hi, raw[q].size)
            if lo < b:
                if journal is not None:
                    journal.save(q, lo, b)
                raw[q][lo:b] = d.inbox[q][parity][:b - lo]

    return read


def allgather(ctx: Ctx, send: np.ndarray, outputs: Sequence[np.ndarray]) -> None:
    """Every member's ``send`` lands in ``outputs[member]`` on every member.

    Args:
        ctx: the call's group view; ``ctx.shm`` is the group's domain.
        send: this member's 1-D array (``outputs[ctx.rank].size`` elements).
        outputs: one 1-D, C-contiguous array per member, in group-rank order.
    """
    d = ctx.team.shm
    if d is None:
        raise no_domain(ctx)
    run_rounds(ctx, Stream.of([send]), _copy_peers(ctx, outputs, d.peers),
               verify=lambda: _check_sizes(ctx, outputs, d.peers))
    outputs[d.rank][...] = send


def gather(ctx: Ctx, send: np.ndarray, outputs: Sequence[np.ndarray] | None, root: int) -> None:
    """Every member's ``send`` lands in ``outputs[member]`` on group rank ``root`` only.

    Args:
        outputs: on ``root``, one array per member; None elsewhere.
        root: the group rank that receives.
    """
    d = ctx.team.shm
    if d is None:
        raise no_domain(ctx)
    if d.rank != root:
        run_rounds(ctx, Stream.of([send]), lambda parity, lo, hi, journal: None)
        return
    assert outputs is not None
    run_rounds(ctx, Stream.of([send], skip=0), _copy_peers(ctx, outputs, d.peers),
               verify=lambda: _check_sizes(ctx, outputs, d.peers))
    outputs[root][...] = send
