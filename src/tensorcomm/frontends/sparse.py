"""Sparse all-reduce: COO ``(indices, values)`` that differ per member, summed into one result.

A sparse array is ``indices`` (int, shape ``(sparse_dim, nnz)`` as torch's COO tensors, or
``(nnz,)`` for rows of dim 0, as TF's ``IndexedSlices``) and ``values`` (shape
``(nnz, *dense_shape[sparse_dim:])``). Members may hold any number of entries, repeated indices
included; nobody needs to know the others' counts. Every member gets the same *coalesced* result:
each index of any member once, in ascending (row-major) order, with the sum (or mean) of every
value given for it. An index that some member gave stays in the result even if its values sum to 0.

Two algorithms, picked the same way on every member from a small header all of them gather
first (sizes, dtype, dense shape; it also carries a flag, so one member's bad input raises on
every member instead of leaving the others waiting):

* ``"gather"``: all-gather every member's indices and values (uneven sizes), then sum the
  duplicates locally. Moves ``total_nnz`` entries to every member.
* ``"dense"``: scatter-add into a dense array, all-reduce it, plus a one-byte-per-index
  presence all-reduce so the result keeps exactly the indices members gave. Moves the dense
  array, whatever the sparsity.

``"auto"`` gathers while the gathered entries (indices and values, all members together) are
under ``DENSE_CROSSOVER[transport]`` times the dense array's bytes, and densifies beyond
(measured: ``benchmarks/sparse_embedding.py --crossover``, docs/sparse.md).
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
from ..types import SUPPORTED_DTYPES, ReduceOp, ReduceOpLike, TransportKind
from . import validate

ALGORITHMS = ("auto", "gather", "dense")

# Gather while total_nnz * (index + value bytes per entry) < DENSE_CROSSOVER * dense bytes.
# Measured at 2 ranks (docs/sparse.md): on shared memory the dense all-reduce is cheap and
# densifying wins from about 0.6; over TCP every gathered byte costs as much as a reduced one
# and gathering wins up to about 1.
DENSE_CROSSOVER = {TransportKind.SHM: 0.6, TransportKind.TCP: 1.0}

_INDEX = np.dtype(np.int64)
_REPEATS_BY_ROUNDS = 32  # up to this many entries per index, _coalesce adds them level by level
# Header fields: ok flag, values dtype, sparse_dim, dense ndim, dense shape fingerprint, algorithm,
# op (0 SUM, 1 AVG), nnz.
_OK, _DTYPE, _SPARSE_DIM, _NDIM, _SHAPE, _ALGORITHM, _OP, _NNZ = range(8)


class _Input:
    """One member's validated arguments (or the reason they are not valid)."""

    def __init__(self, fn: str, indices: Any, values: Any, dense_shape: Any, op: ReduceOpLike,
                 algorithm: str) -> None:
        self.algorithm = algorithm
        self.error: Exception | None = None
        self.flat_index = False
        self.idx = np.empty((0, 1), _INDEX)  # (nnz, sparse_dim)
        self.vals = np.empty(0)
        self.shape: tuple[int, ...] = ()
        self.sparse_dim = 0
        self.op: ReduceOp = ReduceOp.SUM
        self.values_obj: Any = None
        try:
            if algorithm not in ALGORITHMS:
                raise ValueError(f"{fn}: algorithm must be one of {list(ALGORITHMS)}, got {algorithm!r}")
            self._check(fn, indices, values, dense_shape, op)
        except (TypeError, ValueError) as exc:
            self.error = exc

    def _check(self, fn: str, indices: Any, values: Any, dense_shape: Any, op: ReduceOpLike) -> None:
        parsed = ReduceOp.parse(op, f"{fn}: op")
        if parsed not in (ReduceOp.SUM, ReduceOp.AVG):
            raise ValueError(f"{fn}: op must be SUM or AVG for sparse arrays, got {op}")
        self.op = parsed
        if not isinstance(dense_shape, (Sequence, np.ndarray)) or isinstance(dense_shape, str):
            raise TypeError(f"{fn}: dense_shape must be a sequence of ints, got {type(dense_shape).__name__}")
        self.shape = tuple(validate.integer(d, f"dense_shape[{i}]", fn) for i, d in enumerate(dense_shape))
        if not self.shape or min(self.shape) < 0:
            raise ValueError(f"{fn}: dense_shape must hold at least one non-negative size, "
                             f"got {list(self.shape)}")
        staged_idx = validate.array(indices, "indices", fn)
        staged_val = validate.array(values, "values", fn)
        idx, vals = staged_idx.array, staged_val.array
        if idx.dtype.kind not in "iu":
            raise TypeError(f"{fn}: indices must have an integer dtype, got {idx.dtype}")
        if idx.ndim == 1:
            self.flat_index = True
            idx = idx.reshape(1, -1)
        elif idx.ndim != 2:
            raise ValueError(f"{fn}: indices must have shape (sparse_dim, nnz) or (nnz,), "
                             f"got {list(idx.shape)}")
        sparse_dim, nnz = idx.shape
        if not 1 <= sparse_dim <= len(self.shape):
            raise ValueError(f"{fn}: indices have {sparse_dim} sparse dimensions, but dense_shape "
                             f"{list(self.shape)} has {len(self.shape)} dimensions")
        want = (nnz, *self.shape[sparse_dim:])
        if vals.shape != want:
            raise ValueError(f"{fn}: values must have shape {list(want)} ((nnz, *dense_shape[sparse_dim:]) "
                             f"for {nnz} indices), got {list(vals.shape)}")
        kernels.check_op_dtype(self.op, vals.dtype, f"{fn}: op")
        if nnz:
            low, high = idx.min(axis=1), idx.max(axis=1)
            for d in range(sparse_dim):
                if low[d] < 0 or high[d] >= self.shape[d]:
                    raise ValueError(f"{fn}: indices of dimension {d} must lie in [0, {self.shape[d]}), "
                                     f"got values from {int(low[d])} to {int(high[d])}")
        self.sparse_dim = sparse_dim
        self.idx = np.ascontiguousarray(idx.T, dtype=_INDEX)
        self.vals = np.ascontiguousarray(vals)
        self.values_obj = staged_val

    def header(self) -> np.ndarray:
        if self.error is not None:
            return np.zeros(_NNZ + 1, dtype=np.int64)
        fingerprint = zlib.crc32(np.asarray([len(self.shape), *self.shape], dtype=np.int64).tobytes())
        return np.array([1, SUPPORTED_DTYPES.index(self.vals.dtype), self.sparse_dim, len(self.shape),
                         fingerprint, ALGORITHMS.index(self.algorithm), int(self.op is ReduceOp.AVG),
                         self.idx.shape[0]],
                        dtype=np.int64)


def _agree(group: Group, mine: _Input, fn: str) -> np.ndarray:
    """Every member's header; raise on every member if any input is bad or members disagree."""
    header = mine.header()
    table = np.empty((group.size, header.size), dtype=np.int64)
    collectives.all_gather(group, header, table, [header.size] * group.size, False)
    if mine.error is not None:
        raise mine.error
    bad = np.flatnonzero(table[:, _OK] == 0)
    if bad.size:
        raise ValueError(f"{fn}: group ranks {bad.tolist()} passed invalid arguments (their own "
                         f"errors say which); nothing was reduced")
    fields = [_DTYPE, _SPARSE_DIM, _NDIM, _SHAPE, _ALGORITHM, _OP]
    differ = np.flatnonzero((table[:, fields] != table[0, fields]).any(axis=1))
    if differ.size:
        raise CollectiveMismatchError(
            f"{fn}: members disagree on the values' dtype, dense_shape, number of sparse "
            f"dimensions, op or algorithm: group ranks {differ.tolist()} differ from group rank 0 (this rank "
            f"passed {mine.vals.dtype} values, dense_shape {list(mine.shape)}, "
            f"{mine.sparse_dim} sparse dimensions, op {mine.op.name}, algorithm {mine.algorithm!r})")
    return table[:, _NNZ]


def choose(counts: Sequence[int], dense_shape: Sequence[int], sparse_dim: int, itemsize: int,
           transport: TransportKind = TransportKind.SHM) -> str:
    """The algorithm ``"auto"`` picks: ``"gather"`` or ``"dense"`` (see the module docstring)."""
    row = int(np.prod(dense_shape[sparse_dim:], dtype=np.int64)) * itemsize
    gathered = int(sum(counts)) * (sparse_dim * _INDEX.itemsize + row)
    dense = int(np.prod(dense_shape[:sparse_dim], dtype=np.int64)) * row
    return "gather" if gathered < DENSE_CROSSOVER[transport] * dense else "dense"


def _linear(idx: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Row-major positions of ``(nnz, sparse_dim)`` indices in a ``shape`` array."""
    if idx.shape[1] == 1:
        return idx[:, 0]
    return np.ravel_multi_index(tuple(idx.T), shape).astype(_INDEX, copy=False)


def _coalesce(positions: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each position once, ascending, with the sum of its rows in input order (left to right up
    to ``_REPEATS_BY_ROUNDS`` repeats, numpy's ``reduceat`` beyond): every member that
    coalesces the same entries gets the same bits."""
    if not positions.size:
        return positions, vals
    order = np.argsort(positions, kind="stable")
    positions, vals = positions[order], vals[order]
    starts = np.flatnonzero(np.concatenate(([True], positions[1:] != positions[:-1])))
    if starts.size == positions.size:  # no repeats: nothing to sum
        return positions, vals
    lengths = np.diff(np.append(starts, positions.size))
    wide = kernels.accumulation_dtype(ReduceOp.SUM, vals.dtype)
    if lengths.max() > _REPEATS_BY_ROUNDS:
        summed = np.add.reduceat(vals.astype(wide, copy=False), starts, axis=0)
    else:
        # One vectorised add per repeat level (at most a few: one per member, for coalesced
        # inputs) is several times faster than reduceat over rows.
        summed = vals[starts].astype(wide)
        for k in range(1, int(lengths.max())):
            longer = np.flatnonzero(lengths > k)
            summed[longer] += vals[starts[longer] + k]
    return positions[starts], summed.astype(vals.dtype, copy=False)


def _gather(group: Group, mine: _Input, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All-gather every entry, then coalesce: (sorted positions, summed rows)."""
    sdim, trailing = mine.sparse_dim, mine.vals.shape[1:]
    row = int(np.prod(trailing, dtype=np.int64))
    total = int(counts.sum())
    idx = np.empty((total, sdim), _INDEX)
    vals = np.empty((total, *trailing), mine.vals.dtype)
    if total:
        collectives.all_gather(group, mine.idx, idx, (counts * sdim).tolist(), False)
        collectives.all_gather(group, mine.vals, vals, (counts * row).tolist(), False)
    return _coalesce(_linear(idx, mine.shape[:sdim]), vals)


def _dense(group: Group, mine: _Input) -> tuple[np.ndarray, np.ndarray]:
    """Coalesce locally, place into a dense array and all-reduce it: (present positions, rows)."""
    sdim, trailing = mine.sparse_dim, mine.vals.shape[1:]
    rows = int(np.prod(mine.shape[:sdim], dtype=np.int64))
    positions, summed = _coalesce(_linear(mine.idx, mine.shape[:sdim]), mine.vals)
    dense = np.zeros((rows, *trailing), mine.vals.dtype)
    dense[positions] = summed
    present = np.zeros(rows, np.uint8)
    present[positions] = 1
    collectives.all_reduce(group, dense, ReduceOp.SUM, False)
    collectives.all_reduce(group, present, ReduceOp.MAX, False)
    where = np.flatnonzero(present).astype(_INDEX, copy=False)
    return where, dense[where]


def sparse_all_reduce(indices: Any, values: Any, dense_shape: Sequence[int], op: ReduceOpLike = ReduceOp.SUM,
                      group: Any = None, algorithm: str = "auto") -> tuple[np.ndarray, Any]:
    """Sum (or average) sparse COO arrays across the group; every member gets the coalesced result.

    Args:
        indices: integers, shape ``(sparse_dim, nnz)`` or ``(nnz,)`` (rows of dim 0); repeats allowed.
        values: shape ``(nnz, *dense_shape[sparse_dim:])``, a dtype ``all_reduce`` supports.
        dense_shape: the dense array's shape, the same on every member.
        op: ``ReduceOp.SUM`` or ``ReduceOp.AVG`` (or ``"sum"``/``"avg"``).
        group: a ``Group``, a group name, or ``None`` (the world).
        algorithm: ``"auto"`` (by density), ``"gather"`` or ``"dense"``; the same on every member.

    Returns:
        ``(indices, values)``: new arrays, indices int64 in the layout given (``(sparse_dim, n)``
        or ``(n,)``), sorted and unique; values of ``values``'s kind and dtype.

    Raises:
        TypeError, ValueError: bad arguments here (mismatched lengths, non-integer indices, an
            index outside ``dense_shape``, an op other than SUM/AVG); a ValueError naming the
            ranks on every other member, since nothing is reduced.
        CollectiveMismatchError: members passed different dense shapes, value dtypes, numbers of
            sparse dimensions, ops or algorithms.
    """
    fn = "sparse_all_reduce"
    g = validate.group(group, fn)
    mine = _Input(fn, indices, values, dense_shape, op, algorithm)
    counts = _agree(g, mine, fn)
    if algorithm == "auto":
        algorithm = choose(counts.tolist(), mine.shape, mine.sparse_dim, mine.vals.dtype.itemsize,
                           g.transport_kind)
    positions, summed = _gather(g, mine, counts) if algorithm == "gather" else _dense(g, mine)
    if mine.op is ReduceOp.AVG:
        summed = np.array(summed, copy=True)  # it may be the caller's values
        kernels.divide(summed, g.size)
    if mine.flat_index:
        out_idx = positions.copy()
    elif mine.sparse_dim == 1:
        out_idx = positions.reshape(1, -1).copy()
    else:
        out_idx = np.stack(np.unravel_index(positions, mine.shape[:mine.sparse_dim])).astype(_INDEX)
    staged = mine.values_obj
    return out_idx, staged.adapter.new_like(staged.obj, np.ascontiguousarray(summed))
