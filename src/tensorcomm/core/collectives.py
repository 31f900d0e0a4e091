"""Every collective on numpy arrays: the one place frontends call into.

Arguments arrive validated by a frontend (types, lengths, shapes, writability, group ranks),
C-contiguous. Each function picks an algorithm through ``algorithms.select`` and runs it in the
group's issue order. Algorithms write into scratch buffers; results are copied to the caller's
arrays only once the whole collective has succeeded, so a failed call leaves them untouched.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..algorithms import kernels, select
from ..algorithms.base import Ctx
from ..algorithms.signature import UNCHECKED, signature
from ..types import PremulSum, ReduceOp
from .group import Group
from .work import Work

Op = ReduceOp | PremulSum


def _algorithm(collective: str, ctx: Ctx, nbytes: int):  # type: ignore[no-untyped-def]
    return select.choose(collective, ctx, nbytes)


def _copy_out(pieces: Sequence[np.ndarray], flat: np.ndarray) -> None:
    """Split ``flat`` into consecutive pieces shaped like ``pieces`` and copy them in."""
    offset = 0
    for piece in pieces:
        piece.reshape(-1)[...] = flat[offset:offset + piece.size]
        offset += piece.size


def all_reduce(group: Group, array: np.ndarray, op: Op, async_op: bool) -> Work | None:
    """Reduce ``array`` across the group, in place on every member."""
    flat = array.reshape(-1)

    def body(ctx: Ctx) -> None:
        base, work = kernels.prepare(op, flat)
        _algorithm("allreduce", ctx, work.nbytes)(ctx, work, base)
        kernels.finish(op, work, flat, ctx.size)

    return group.run("all_reduce", body, async_op, signature("all_reduce", flat.dtype, flat.size, op))


def reduce(group: Group, array: np.ndarray, root: int, op: Op, async_op: bool) -> Work | None:
    """Reduce ``array`` onto group rank ``root``; other members' arrays are left as they are."""
    flat = array.reshape(-1)

    def body(ctx: Ctx) -> None:
        base, work = kernels.prepare(op, flat)
        out = np.empty_like(work) if ctx.rank == root else None
        _algorithm("reduce", ctx, work.nbytes)(ctx, work, out, root, base)
        if out is not None:
            kernels.finish(op, out, flat, ctx.size)

    return group.run("reduce", body, async_op, signature("reduce", flat.dtype, flat.size, op, root))


def broadcast(group: Group, array: np.ndarray, root: int, async_op: bool) -> Work | None:
    """Copy group rank ``root``'s ``array`` into every member's."""
    flat = array.reshape(-1)

    def body(ctx: Ctx) -> None:
        work = flat if ctx.rank == root else np.empty_like(flat)
        _algorithm("broadcast", ctx, work.nbytes)(ctx, work, root)
        if ctx.rank != root:
            flat[...] = work

    return group.run("broadcast", body, async_op, signature("broadcast", flat.dtype, flat.size, root=root))


def all_gather(group: Group, outputs: Sequence[np.ndarray], array: np.ndarray,
               async_op: bool) -> Work | None:
    """Every member's ``array`` lands in ``outputs[member]`` on every member.

    ``outputs`` may have different sizes per member (the "v" variant); ``outputs[i].size`` is
    what member ``i`` sends.
    """
    send = array.reshape(-1)
    counts = [o.size for o in outputs]

    def body(ctx: Ctx) -> None:
        out = np.empty(sum(counts), dtype=send.dtype)
        _algorithm("allgather", ctx, out.nbytes)(ctx, send, out, counts)
        _copy_out(outputs, out)

    return group.run("all_gather", body, async_op, signature("all_gather", send.dtype, sum(counts)))


def gather(group: Group, array: np.ndarray, outputs: Sequence[np.ndarray] | None, root: int,
           counts: Sequence[int], async_op: bool) -> Work | None:
    """Member ``i``'s ``array`` lands in ``outputs[i]`` on ``root`` only (``counts[i]`` elements)."""
    send = array.reshape(-1)

    def body(ctx: Ctx) -> None:
        out = np.empty(sum(counts), dtype=send.dtype) if ctx.rank == root else None
        _algorithm("gather", ctx, send.nbytes * ctx.size)(ctx, send, out, list(counts), root)
        if out is not None and outputs is not None:
            _copy_out(outputs, out)

    return group.run("gather", body, async_op, signature("gather", send.dtype, sum(counts), root=root))


def scatter(group: Group, array: np.ndarray, inputs: Sequence[np.ndarray] | None, root: int,
            counts: Sequence[int], async_op: bool) -> Work | None:
    """``inputs[i]`` on ``root`` lands in member ``i``'s ``array``."""
    flat = array.reshape(-1)

    def body(ctx: Ctx) -> None:
        send = np.concatenate([i.reshape(-1) for i in inputs]) if inputs is not None else None
        out = np.empty_like(flat)
        _algorithm("scatter", ctx, flat.nbytes * ctx.size)(ctx, send, out, list(counts), root)
        flat[...] = out

    return group.run("scatter", body, async_op, signature("scatter", flat.dtype, sum(counts), root=root))


def reduce_scatter(group: Group, output: np.ndarray, inputs: Sequence[np.ndarray], op: Op,
                   async_op: bool) -> Work | None:
    """Reduce ``inputs[i]`` across members into member ``i``'s ``output``."""
    flat = output.reshape(-1)
    counts = [i.size for i in inputs]

    def body(ctx: Ctx) -> None:
        base, send = kernels.prepare(op, np.concatenate([i.reshape(-1) for i in inputs]))
        out = np.empty(counts[ctx.rank], dtype=send.dtype)
        _algorithm("reduce_scatter", ctx, send.nbytes)(ctx, send, out, counts, base)
        kernels.finish(op, out, flat, ctx.size)

    return group.run("reduce_scatter", body, async_op,
                     signature("reduce_scatter", flat.dtype, sum(counts), op))


def all_to_all(group: Group, outputs: Sequence[np.ndarray], inputs: Sequence[np.ndarray],
               async_op: bool) -> Work | None:
    """``inputs[j]`` of member ``i`` lands in ``outputs[i]`` of member ``j``."""
    send_counts = [i.size for i in inputs]
    recv_counts = [o.size for o in outputs]

    def body(ctx: Ctx) -> None:
        send = np.concatenate([i.reshape(-1) for i in inputs])
        out = np.empty(sum(recv_counts), dtype=send.dtype)
        _algorithm("alltoall", ctx, send.nbytes)(ctx, send, send_counts, out, recv_counts)
        _copy_out(outputs, out)

    return group.run("all_to_all", body, async_op, signature("all_to_all", outputs[0].dtype, UNCHECKED))


def all_to_all_flat(group: Group, output: np.ndarray, send_counts: Sequence[int],
                    array: np.ndarray, recv_counts: Sequence[int], async_op: bool) -> Work | None:
    """``all_to_all`` on two flat arrays cut into per-member blocks of the given element counts."""
    send = array.reshape(-1)
    flat = output.reshape(-1)

    def body(ctx: Ctx) -> None:
        out = np.empty_like(flat)
        _algorithm("alltoall", ctx, send.nbytes)(ctx, send, list(send_counts), out, list(recv_counts))
        flat[...] = out

    return group.run("all_to_all_single", body, async_op, signature("all_to_all", flat.dtype, UNCHECKED))


def barrier(group: Group, async_op: bool) -> Work | None:
    """Return once every member has entered the barrier."""

    def body(ctx: Ctx) -> None:
        _algorithm("barrier", ctx, 0)(ctx)

    return group.run("barrier", body, async_op, signature("barrier"))
