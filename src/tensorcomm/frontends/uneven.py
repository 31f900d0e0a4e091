"""The "v" collectives: dim-0 sizes that differ per member and that receivers need not know.

``all_to_all_v`` (Horovod's ``alltoall`` with splits), ``all_gather_v``, ``gather_v`` and
``scatter_v`` exchange the sizes for the caller, then move the data with one core collective, so
nobody pads by hand. ``reduce_scatter_v`` (MPI's ``Reduce_scatter`` with ``recvcounts``) gives
member i ``splits[i]`` rows of the reduced tensor; there every member passes the same splits, and
the header checks that they do. Arrays are cut and joined along dim 0; every member passes the same dtype
and the same shape beyond dim 0. Results are new arrays; inputs are never modified.

Sizes travel in a small header that every member gathers first (``all_gather`` of a few int64s,
n + 3 of them for ``all_to_all_v``). It also carries each member's dtype and a fingerprint of its
shape beyond dim 0, so a mismatch raises ``CollectiveMismatchError`` on every member at once
instead of garbling the data.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..algorithms import kernels
from ..core import collectives
from ..core.group import Group
from ..errors import CollectiveMismatchError
from ..types import SUPPORTED_DTYPES, ReduceOp, ReduceOpLike
from . import validate
from .arrays import Staged

_CHECKED = 2  # leading header fields every member must agree on: dtype index, shape fingerprint


def _rows(staged: Staged, fn: str) -> int:
    if staged.array.ndim == 0:
        raise ValueError(f"{fn}: the tensor needs at least one dimension, got a 0-d array")
    return staged.array.shape[0]


def _row_size(x: np.ndarray) -> int:
    return int(np.prod(x.shape[1:], dtype=np.int64))


def _shape_fingerprint(shape: Sequence[int]) -> int:
    # A checksum, not the shape itself, keeps the header fixed-length for any ndim; a collision
    # (odds 2**-32) would only let a mismatch through undetected, as without the check.
    return zlib.crc32(np.asarray([len(shape), *shape], dtype=np.int64).tobytes())


def _headers(group: Group, x: np.ndarray, extra: Sequence[int], fn: str) -> np.ndarray:
    """Every member's ``[dtype, shape fingerprint, *extra]``, one row per group rank.

    Raises:
        CollectiveMismatchError: on every member, when members disagree on dtype or trailing shape.
    """
    mine = np.array([SUPPORTED_DTYPES.index(x.dtype), _shape_fingerprint(x.shape[1:]), *extra],
                    dtype=np.int64)
    table = np.empty((group.size, mine.size), dtype=np.int64)
    collectives.all_gather(group, mine, table, [mine.size] * group.size, False)
    differ = np.flatnonzero((table[:, :_CHECKED] != table[0, :_CHECKED]).any(axis=1))
    if differ.size:
        raise CollectiveMismatchError(
            f"{fn}: members disagree on the dtype or the shape beyond dim 0: group ranks "
            f"{differ.tolist()} differ from group rank 0 (this rank passed {x.dtype}"
            f"[*, {', '.join(map(str, x.shape[1:]))}])")
    return table


def exchange(group: Group, x: np.ndarray, send_rows: Sequence[int], fn: str) -> tuple[np.ndarray, list[int]]:
    """Send ``send_rows[i]`` dim-0 rows of ``x`` to member i; return what arrives and from whom.

    The numpy core of ``all_to_all_v``, shared with the ``AlltoAllV`` operator.
    """
    table = _headers(group, x, send_rows, fn)
    recv_rows = table[:, _CHECKED + group.rank]
    row = _row_size(x)
    out = np.empty((int(recv_rows.sum()), *x.shape[1:]), dtype=x.dtype)
    collectives.all_to_all(group, np.ascontiguousarray(x), [r * row for r in send_rows], out,
                           (recv_rows * row).tolist(), False)
    return out, recv_rows.tolist()


def all_to_all_v(tensor: Any, splits: Sequence[int] | None = None,
                 group: Any = None) -> tuple[Any, list[int]]:
    """Send ``splits[i]`` dim-0 rows of ``tensor`` to member i; receive without knowing the sizes.

    Args:
        tensor: array of at least one dimension.
        splits: rows for each member, summing to ``tensor.shape[0]`` (``None``: equal parts).
        group: a ``Group``, a group name, or ``None`` (the world).

    Returns:
        ``(received, received_splits)``: the arriving rows concatenated in source-rank order, and
        how many rows came from each member.

    Raises:
        TypeError: a non-array tensor, bad ``splits`` types.
        ValueError: ``splits`` of the wrong length or sum, a 0-d tensor.
        CollectiveMismatchError: members passed different dtypes or trailing shapes.
    """
    fn = "all_to_all_v"
    g = validate.group(group, fn)
    staged = validate.array(tensor, "tensor", fn)
    send = validate.split_sizes(splits, "splits", fn, g.size, _rows(staged, fn))
    out, received = exchange(g, staged.array, send, fn)
    return staged.adapter.new_like(staged.obj, out), received


def all_gather_v(tensor: Any, group: Any = None) -> tuple[Any, list[int]]:
    """Concatenate every member's ``tensor`` along dim 0, whatever its dim-0 size.

    Returns:
        ``(gathered, sizes)``: the concatenation in rank order and each member's dim-0 size.

    Raises:
        TypeError, ValueError, CollectiveMismatchError: as ``all_to_all_v``.
    """
    fn = "all_gather_v"
    g = validate.group(group, fn)
    staged = validate.array(tensor, "tensor", fn)
    x = staged.array
    sizes = _headers(g, x, [_rows(staged, fn)], fn)[:, _CHECKED]
    out = np.empty((int(sizes.sum()), *x.shape[1:]), dtype=x.dtype)
    collectives.all_gather(g, np.ascontiguousarray(x), out, (sizes * _row_size(x)).tolist(), False)
    return staged.adapter.new_like(staged.obj, out), sizes.tolist()


def gather_v(tensor: Any, dst: int = 0, group: Any = None) -> tuple[Any, list[int]] | None:
    """Concatenate every member's ``tensor`` along dim 0 on global rank ``dst`` only.

    Returns:
        ``(gathered, sizes)`` on ``dst`` (as ``all_gather_v``), ``None`` on the other ranks.

    Raises:
        TypeError, ValueError, CollectiveMismatchError: as ``all_to_all_v``; ValueError for a
            ``dst`` outside the group.
    """
    fn = "gather_v"
    g = validate.group(group, fn)
    root = validate.rank(dst, "dst", fn, g)
    staged = validate.array(tensor, "tensor", fn)
    x = staged.array
    sizes = _headers(g, x, [_rows(staged, fn)], fn)[:, _CHECKED]
    out = np.empty((int(sizes.sum()), *x.shape[1:]), dtype=x.dtype) if g.rank == root else None
    collectives.gather(g, np.ascontiguousarray(x), out, (sizes * _row_size(x)).tolist(), root, False)
    return None if out is None else (staged.adapter.new_like(staged.obj, out), sizes.tolist())


def scatter_v(tensor: Any = None, splits: Sequence[int] | None = None, src: int = 0,
              group: Any = None) -> Any:
    """Give member i ``splits[i]`` dim-0 rows of global rank ``src``'s ``tensor``.

    Only ``src`` passes ``tensor`` and ``splits``; the others learn dtype, shape and sizes from it
    (their ``tensor`` and ``splits`` are ignored; pass ``None``).

    Returns:
        This member's rows: an array of ``tensor``'s kind on ``src``, a numpy array elsewhere.

    Raises:
        TypeError: on ``src``, a non-array tensor or bad ``splits`` types.
        ValueError: on ``src``, ``splits`` of the wrong length or sum, or a 0-d tensor; anywhere,
            a ``src`` outside the group.
    """
    fn = "scatter_v"
    g = validate.group(group, fn)
    root = validate.rank(src, "src", fn, g)
    staged: Staged | None = None
    x: np.ndarray | None = None
    if g.rank == root:
        staged = validate.array(tensor, "tensor", fn)
        sizes = validate.split_sizes(splits, "splits", fn, g.size, _rows(staged, fn))
        x = np.ascontiguousarray(staged.array)
        kind = np.array([SUPPORTED_DTYPES.index(x.dtype), x.ndim], dtype=np.int64)
        layout = np.array([*x.shape, *sizes], dtype=np.int64)
    else:
        kind = np.empty(2, dtype=np.int64)
    # Two small broadcasts: the dtype and ndim first, so receivers can size the second one.
    collectives.broadcast(g, kind, root, False)
    if x is None:
        layout = np.empty(int(kind[1]) + g.size, dtype=np.int64)
    collectives.broadcast(g, layout, root, False)
    dtype, shape, rows = SUPPORTED_DTYPES[int(kind[0])], tuple(layout[:kind[1]].tolist()), layout[kind[1]:]
    out = np.empty((int(rows[g.rank]), *shape[1:]), dtype=dtype)
    row = int(np.prod(shape[1:], dtype=np.int64))
    collectives.scatter(g, x, out, (rows * row).tolist(), root, False)
    return out if staged is None else staged.adapter.new_like(staged.obj, out)


def agree_if_uneven(group: Group, send: np.ndarray, counts: Sequence[int], op: ReduceOpLike,
                    fn: str) -> None:
    """``agree_counts`` where this member's blocks differ in size: blocks of one size need no
    agreement (the core's reduce_scatter compares their total, which then fixes each block)."""
    if counts.count(counts[0]) != len(counts):
        agree_counts(group, send, counts, op, fn)


def agree_counts(group: Group, send: np.ndarray, counts: Sequence[int], op: ReduceOpLike, fn: str) -> None:
    """Check, before a reduce-scatter whose blocks differ in size (``counts[q]`` elements for
    member ``q``), that every member passes the same dtype and counts: the core's reduce_scatter
    compares only the total between members. An all-gather of a few int64s, done before the
    call returns even with ``async_op``, so members that split differently all get an error.

    Raises:
        ValueError: an op the dtype does not support (on the calling member, before any message).
        CollectiveMismatchError: on every member, when members pass different dtypes or counts.
    """
    kernels.check_op_dtype(ReduceOp.parse(op, f"{fn}: op"), send.dtype, f"{fn}: op")
    fingerprint = zlib.crc32(np.asarray(counts, dtype=np.int64).tobytes())
    mine = np.array([SUPPORTED_DTYPES.index(send.dtype), fingerprint], dtype=np.int64)
    table = np.empty((group.size, mine.size), dtype=np.int64)
    collectives.all_gather(group, mine, table, [mine.size] * group.size, False)
    differ = np.flatnonzero((table != table[0]).any(axis=1))
    if differ.size:
        raise CollectiveMismatchError(
            f"{fn}: members disagree on the dtype or the block sizes: group ranks {differ.tolist()} "
            f"differ from group rank 0 (this rank passed {send.dtype} blocks of {list(counts)} elements)")


def reduce_scatter_v(tensor: Any, splits: Sequence[int] | None = None, op: ReduceOpLike = ReduceOp.SUM,
                     group: Any = None) -> Any:
    """Reduce ``tensor`` across members; member i gets rows ``splits[i]`` of the result (dim 0).

    MPI's ``Reduce_scatter(sendbuf, recvbuf, recvcounts)``: every member passes a tensor of the
    same shape and the same ``splits``; the rows of member i's block follow those of members
    0..i-1.

    Args:
        tensor: array of at least one dimension.
        splits: rows for each member, summing to ``tensor.shape[0]`` (``None``: equal parts).
        op: the reduction, as ``all_reduce``'s.
        group: a ``Group``, a group name, or ``None`` (the world).

    Returns:
        A new array of ``tensor``'s kind: this member's ``splits[rank]`` rows of the reduction.

    Raises:
        TypeError: a non-array tensor, bad ``splits`` types, a bad ``op``.
        ValueError: ``splits`` of the wrong length or sum, a 0-d tensor, an op the dtype does not
            support.
        CollectiveMismatchError: members passed different dtypes, shapes or splits.
    """
    fn = "reduce_scatter_v"
    g = validate.group(group, fn)
    staged = validate.array(tensor, "tensor", fn)
    rows = validate.split_sizes(splits, "splits", fn, g.size, _rows(staged, fn))
    x = staged.array
    row = _row_size(x)
    out = np.empty((rows[g.rank], *x.shape[1:]), dtype=x.dtype)
    send, counts = np.ascontiguousarray(x), [r * row for r in rows]
    agree_counts(g, send, counts, op, fn)
    collectives.reduce_scatter(g, send, out, counts, op, False, fn)
    return staged.adapter.new_like(staged.obj, out)
