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


def _check_sizes(ctx: Ctx, outputs: Sequence[np.ndarray], senders: Sequence[int],
                 extents: list[int]) -> None:
    for q in senders:
        if extents[q] != outputs[q].nbytes:
            d, itemsize = ctx.team.shm, outputs[q].itemsize
            raise CollectiveMismatchError(
                f"rank {d.global_ranks[q]} called {ctx.name} with {extents[q] // itemsize} "
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


def _one_slot(d, dtype: np.dtype, sizes: tuple[int, ...], total: int):  # type: ignore[no-untyped-def]
    """Set-up of a one-round call whose member ``q`` contributes ``sizes[q]`` elements: per slot
    parity, every member's slot as typed views; the extents to expect. False when the call's total
    (the signature's count, known alike to every member) does not fit one slot: then every member
    takes ``run_rounds``."""
    itemsize = dtype.itemsize
    if total * itemsize > d.slot_bytes:
        return False
    views = tuple(tuple(d.inbox[q][p][:sizes[q] * itemsize].view(dtype) for q in range(d.size))
                  for p in (0, 1))
    return views, [size * itemsize for size in sizes]


def allgather(ctx: Ctx, send: np.ndarray, outputs: Sequence[np.ndarray]) -> None:
    """Every member's ``send`` lands in ``outputs[member]`` on every member.

    Args:
        ctx: the call's group view; ``ctx.team.shm`` is the group's domain.
        send: this member's 1-D array (``outputs[ctx.rank].size`` elements).
        outputs: one 1-D, C-contiguous array per member, in group-rank order.
    """
    d = ctx.team.shm
    if d is None:
        raise no_domain(ctx)
    sizes = tuple(o.size for o in outputs)
    key = ("allgather", ctx.signature, sizes)
    setup = d.memo.get(key)
    if setup is None:
        setup = d.remember(key, _one_slot(d, send.dtype, sizes, ctx.signature.count))
    if setup is False:
        run_rounds(ctx, Stream.of([send]), _copy_peers(ctx, outputs, d.peers),
                   verify=lambda extents: _check_sizes(ctx, outputs, d.peers, extents))
    else:  # one round, through cached views: what run_rounds does, without its per-call set-up
        views, expected = setup
        rounds = d.round
        slots = views[rounds & 1]
        slots[d.rank][...] = send
        d.start(ctx, send.nbytes)
        extents = d.extents(ctx)
        if extents != expected:
            _check_sizes(ctx, outputs, d.peers, extents)
        d.round = rounds + 1
        for q in d.peers:
            outputs[q][...] = slots[q]
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
    r = d.rank
    sizes = tuple(o.size for o in outputs) if outputs is not None else (send.size,) * d.size
    key = ("gather", ctx.signature, sizes)
    setup = d.memo.get(key)
    if setup is None:
        setup = d.remember(key, _one_slot(d, send.dtype, sizes, ctx.signature.count))
    if setup is False:
        if r != root:
            run_rounds(ctx, Stream.of([send]), lambda parity, lo, hi, journal: None)
            return
        assert outputs is not None
        run_rounds(ctx, Stream.of([send], skip=0), _copy_peers(ctx, outputs, d.peers),
                   verify=lambda extents: _check_sizes(ctx, outputs, d.peers, extents))
        outputs[root][...] = send
        return
    views, expected = setup
    rounds = d.round
    slots = views[rounds & 1]
    if r != root:
        slots[r][...] = send
    d.start(ctx, send.nbytes)
    d.round = rounds + 1
    if r != root:
        return
    assert outputs is not None
    extents = d.extents(ctx)
    extents[root] = expected[root]  # the root sends nothing
    if extents != expected:
        _check_sizes(ctx, outputs, d.peers, extents)
    for q in d.peers:
        outputs[q][...] = slots[q]
    outputs[root][...] = send
