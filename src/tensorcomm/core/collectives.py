"""Every collective on numpy arrays: the one place frontends call into.

Arguments arrive validated by a frontend (types, lengths, shapes, writability, group ranks),
C-contiguous. Each function picks an algorithm through ``algorithms.select`` and runs it in the
group's issue order. A failed call leaves arrays it updates in place (all-reduce, reduce's root,
broadcast's receivers) untouched:

- *direct* rows (shared memory, ``row.direct``) take the caller's arrays and op and write results
  themselves, only once every peer's data is in, or under a journal that undoes a failed call;
  outputs that are not also inputs may be partly written when a call larger than one slot fails
  (see ``algorithms/shm_common.py``);
- transport rows work on scratch buffers (``kernels.prepare`` for reductions), and the results
  are copied to the caller's arrays only once the whole collective has succeeded.

The per-call path is the latency budget of small messages, so what does not change between calls
is cached: signatures and chosen rows per call shape (``_reduction``, ``_shape``), each group's
``Team`` and labels (``Group``), reduction plans and slot views (``algorithms/shm_*.py``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..algorithms import kernels, select
from ..algorithms.base import Ctx
from ..signature import UNCHECKED, signature
from ..types import PremulSum, ReduceOp
from .group import Group
from .work import Work

Op = ReduceOp | PremulSum

_REDUCTIONS: dict[tuple, list] = {}  # type: ignore[type-arg]
_last_reduction: tuple = (None,) * 6  # type: ignore[type-arg]
_CACHE_LIMIT = 4096


def _op_key(op: Op | None) -> object:
    # ReduceOp members hash through Python code (Enum.__hash__); their value hashes in C.
    return op._value_ if type(op) is ReduceOp else op  # type: ignore[union-attr]


def _reduction(collective: str, flat: np.ndarray, op: Op, root: int = -1) -> list:  # type: ignore[type-arg]
    """What repeats between reductions of one shape, cached: ``[signature, bytes moved (in the
    accumulation dtype), (team, row)]``; the last remembers the row ``_pick`` chose for a team."""
    global _last_reduction
    size, dtype = flat.size, flat.dtype
    last = _last_reduction  # calls in a loop repeat one shape: compare before hashing
    if size == last[0] and dtype is last[1] and op is last[2] and collective is last[3] and root == last[4]:
        return last[5]
    key = (size, dtype, op._value_ if type(op) is ReduceOp else op, collective, root)
    found = _REDUCTIONS.get(key)
    if found is None:
        if len(_REDUCTIONS) >= _CACHE_LIMIT:
            _REDUCTIONS.clear()
        nbytes = size * kernels.accumulation_dtype(op, dtype).itemsize
        found = _REDUCTIONS[key] = [signature(collective, dtype, size, op, root), nbytes, (None, None)]
    _last_reduction = (size, dtype, op, collective, root, found)
    return found


_SHAPES: dict[tuple, list] = {}  # type: ignore[type-arg]


def _shape(collective: str, name: str, dtype: np.dtype | None, count: int, nbytes: int,
           root: int = -1, op: Op | None = None) -> list:  # type: ignore[type-arg]
    """``[signature, nbytes, (team, row)]`` for a call of ``collective`` (the select table's name;
    ``name`` is the signature's), cached like ``_reduction``."""
    key = (collective, dtype, count, nbytes, root, _op_key(op))
    found = _SHAPES.get(key)
    if found is None:
        if len(_SHAPES) >= _CACHE_LIMIT:
            _SHAPES.clear()
        found = _SHAPES[key] = [signature(name, dtype, count, op, root), nbytes, (None, None)]
    return found


def _pick(collective: str, ctx: Ctx, cached: list) -> select.Row:  # type: ignore[type-arg]
    """``select.pick`` for a cached call shape: rows' predicates depend only on the team and the
    size, so the choice for the last team is kept in ``cached``."""
    chosen = cached[2]  # one tuple, replaced whole: threads never see a team with another's row
    if chosen[0] is not ctx.team:
        chosen = cached[2] = (ctx.team, select.pick(collective, ctx, cached[1]))
    return chosen[1]


def _flat(array: np.ndarray) -> np.ndarray:
    return array if array.ndim == 1 else array.reshape(-1)


def _copy_out(pieces: Sequence[np.ndarray], flat: np.ndarray) -> None:
    """Split ``flat`` into consecutive pieces shaped like ``pieces`` and copy them in."""
    offset = 0
    for piece in pieces:
        piece.reshape(-1)[...] = flat[offset:offset + piece.size]
        offset += piece.size


def all_reduce(group: Group, array: np.ndarray, op: Op, async_op: bool) -> Work | None:
    """Reduce ``array`` across the group, in place on every member."""
    flat = array if array.ndim == 1 else array.reshape(-1)
    cached = _reduction("all_reduce", flat, op)

    def body(ctx: Ctx) -> None:
        row = _pick("allreduce", ctx, cached)
        if row.direct:
            row.fn(ctx, flat, op)
            return
        base, work = kernels.prepare(op, flat)
        row.fn(ctx, work, base)
        kernels.finish(op, work, flat, ctx.size)

    return group.run("all_reduce", body, async_op, cached[0])


def reduce(group: Group, array: np.ndarray, root: int, op: Op, async_op: bool) -> Work | None:
    """Reduce ``array`` onto group rank ``root``; other members' arrays are left as they are."""
    flat = _flat(array)
    cached = _reduction("reduce", flat, op, root)

    def body(ctx: Ctx) -> None:
        row = _pick("reduce", ctx, cached)
        if row.direct:
            row.fn(ctx, flat, root, op)
            return
        base, work = kernels.prepare(op, flat)
        out = np.empty_like(work) if ctx.rank == root else None
        row.fn(ctx, work, out, root, base)
        if out is not None:
            kernels.finish(op, out, flat, ctx.size)

    return group.run("reduce", body, async_op, cached[0])


def broadcast(group: Group, array: np.ndarray, root: int, async_op: bool) -> Work | None:
    """Copy group rank ``root``'s ``array`` into every member's."""
    flat = _flat(array)
    cached = _shape("broadcast", "broadcast", flat.dtype, flat.size, flat.nbytes, root)

    def body(ctx: Ctx) -> None:
        row = _pick("broadcast", ctx, cached)
        if row.direct:
            row.fn(ctx, flat, root)
            return
        work = flat if ctx.rank == root else np.empty_like(flat)
        row.fn(ctx, work, root)
        if ctx.rank != root:
            flat[...] = work

    return group.run("broadcast", body, async_op, cached[0])


def all_gather(group: Group, outputs: Sequence[np.ndarray], array: np.ndarray,
               async_op: bool) -> Work | None:
    """Every member's ``array`` lands in ``outputs[member]`` on every member.

    ``outputs`` may have different sizes per member (the "v" variant); ``outputs[i].size`` is
    what member ``i`` sends.
    """
    send = _flat(array)
    counts = [o.size for o in outputs]
    total = sum(counts)
    cached = _shape("allgather", "all_gather", send.dtype, total, total * send.itemsize)

    def body(ctx: Ctx) -> None:
        row = _pick("allgather", ctx, cached)
        if row.direct:
            row.fn(ctx, send, [_flat(o) for o in outputs])
            return
        out = np.empty(total, dtype=send.dtype)
        row.fn(ctx, send, out, counts)
        _copy_out(outputs, out)

    return group.run("all_gather", body, async_op, cached[0])


def gather(group: Group, array: np.ndarray, outputs: Sequence[np.ndarray] | None, root: int,
           counts: Sequence[int], async_op: bool) -> Work | None:
    """Member ``i``'s ``array`` lands in ``outputs[i]`` on ``root`` only (``counts[i]`` elements)."""
    send = _flat(array)
    cached = _shape("gather", "gather", send.dtype, sum(counts), send.nbytes * group.size, root)

    def body(ctx: Ctx) -> None:
        row = _pick("gather", ctx, cached)
        if row.direct:
            row.fn(ctx, send, None if outputs is None else [_flat(o) for o in outputs], root)
            return
        out = np.empty(sum(counts), dtype=send.dtype) if ctx.rank == root else None
        row.fn(ctx, send, out, list(counts), root)
        if out is not None and outputs is not None:
            _copy_out(outputs, out)

    return group.run("gather", body, async_op, cached[0])


def scatter(group: Group, array: np.ndarray, inputs: Sequence[np.ndarray] | None, root: int,
            counts: Sequence[int], async_op: bool) -> Work | None:
    """``inputs[i]`` on ``root`` lands in member ``i``'s ``array``."""
    flat = _flat(array)
    cached = _shape("scatter", "scatter", flat.dtype, sum(counts), flat.nbytes * group.size, root)

    def body(ctx: Ctx) -> None:
        row = _pick("scatter", ctx, cached)
        if row.direct:
            row.fn(ctx, flat, None if inputs is None else [_flat(i) for i in inputs], list(counts), root)
            return
        send = np.concatenate([i.reshape(-1) for i in inputs]) if inputs is not None else None
        out = np.empty_like(flat)
        row.fn(ctx, send, out, list(counts), root)
        flat[...] = out

    return group.run("scatter", body, async_op, cached[0])


def reduce_scatter(group: Group, output: np.ndarray, inputs: Sequence[np.ndarray], op: Op,
                   async_op: bool) -> Work | None:
    """Reduce ``inputs[i]`` across members into member ``i``'s ``output``."""
    flat = _flat(output)
    counts = [i.size for i in inputs]
    total = sum(counts)

    cached = _shape("reduce_scatter", "reduce_scatter", flat.dtype, total, total * flat.itemsize, op=op)

    def body(ctx: Ctx) -> None:
        row = _pick("reduce_scatter", ctx, cached)
        if row.direct:
            row.fn(ctx, flat, [_flat(i) for i in inputs], op)
            return
        base, send = kernels.prepare(op, np.concatenate([i.reshape(-1) for i in inputs]))
        out = np.empty(counts[ctx.rank], dtype=send.dtype)
        row.fn(ctx, send, out, counts, base)
        kernels.finish(op, out, flat, ctx.size)

    return group.run("reduce_scatter", body, async_op, cached[0])


def all_to_all(group: Group, outputs: Sequence[np.ndarray], inputs: Sequence[np.ndarray],
               async_op: bool) -> Work | None:
    """``inputs[j]`` of member ``i`` lands in ``outputs[i]`` of member ``j``."""
    send_counts = [i.size for i in inputs]
    recv_counts = [o.size for o in outputs]
    cached = _shape("alltoall", "all_to_all", outputs[0].dtype, UNCHECKED,
                    sum(send_counts) * inputs[0].itemsize)

    def body(ctx: Ctx) -> None:
        row = _pick("alltoall", ctx, cached)
        if row.direct:
            row.fn(ctx, [_flat(o) for o in outputs], [_flat(i) for i in inputs])
            return
        send = np.concatenate([i.reshape(-1) for i in inputs])
        out = np.empty(sum(recv_counts), dtype=send.dtype)
        row.fn(ctx, send, send_counts, out, recv_counts)
        _copy_out(outputs, out)

    return group.run("all_to_all", body, async_op, cached[0])


def all_to_all_flat(group: Group, output: np.ndarray, send_counts: Sequence[int],
                    array: np.ndarray, recv_counts: Sequence[int], async_op: bool) -> Work | None:
    """``all_to_all`` on two flat arrays cut into per-member blocks of the given element counts."""
    send = _flat(array)
    flat = _flat(output)
    cached = _shape("alltoall", "all_to_all", flat.dtype, UNCHECKED, send.nbytes)

    def body(ctx: Ctx) -> None:
        row = _pick("alltoall", ctx, cached)
        if row.direct:
            row.fn(ctx, _split(flat, recv_counts), _split(send, send_counts))
            return
        out = np.empty_like(flat)
        row.fn(ctx, send, list(send_counts), out, list(recv_counts))
        flat[...] = out

    return group.run("all_to_all_single", body, async_op, cached[0])


def _split(flat: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
    pieces, offset = [], 0
    for count in counts:
        pieces.append(flat[offset:offset + count])
        offset += count
    return pieces


def barrier(group: Group, async_op: bool) -> Work | None:
    """Return once every member has entered the barrier."""

    cached = _shape("barrier", "barrier", None, 0, 0)

    def body(ctx: Ctx) -> None:
        _pick("barrier", ctx, cached).fn(ctx)

    return group.run("barrier", body, async_op, cached[0])
