"""MindSpore ``ops`` style: operator objects built once, called on arrays, returning new arrays.

An operator never modifies its input; it returns a new array of the input's kind (through the
input's adapter). Arguments given at construction are type-checked there, as MindSpore does;
the group is resolved at each call, so an operator may be built before the group is created.
``group`` is a registered group name (``"world"`` always exists) or a ``Group``; ranks given to
operators (``root_rank``, neighbour ids) are global ranks, as everywhere in tensorcomm. Every
member of the group calls the operator with matching arguments, as every collective requires.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..algorithms import kernels
from ..core import collectives
from ..core.group import Group
from ..core.lifecycle import WORLD
from ..types import ReduceOp, ReduceOpLike
from . import validate
from .arrays import Staged


class _Operator:
    """What every operator shares: the group, type-checked once at construction."""

    def __init__(self, group: str | Group) -> None:
        if not isinstance(group, (str, Group)):
            raise TypeError(f"{self._fn}: group must be a group name (str) or a tensorcomm.Group, "
                            f"got {type(group).__name__}")
        self.group = group

    @property
    def _fn(self) -> str:
        return type(self).__name__

    def _resolve(self) -> Group:
        return validate.group(self.group, self._fn)

    def _input(self, value: Any, argument: str = "input_x") -> Staged:
        return validate.array(value, argument, self._fn)

    @staticmethod
    def _new(staged: Staged, result: np.ndarray) -> Any:
        return staged.adapter.new_like(staged.obj, result)


def _copy(staged: Staged) -> np.ndarray:
    """A fresh C-contiguous copy: collectives work in place and the input must stay as it is."""
    return np.array(staged.array, order="C", copy=True)


def _reduce_op(op: ReduceOpLike, fn: str) -> ReduceOp:
    parsed = ReduceOp.parse(op, f"{fn}: op")
    if not isinstance(parsed, ReduceOp):
        raise TypeError(f"{fn}: op must be a ReduceOp or its name, got {parsed!r}")
    return parsed


def _reducible(staged: Staged, op: ReduceOp, fn: str) -> None:
    # MindSpore refuses bool inputs to its reductions with a TypeError; so do we.
    if staged.array.dtype == np.bool_:
        raise TypeError(f"{fn}: input_x dtype bool is not supported by reductions")
    kernels.check_op_dtype(op, staged.array.dtype, f"{fn}: op")


def _rows(staged: Staged, fn: str) -> int:
    if staged.array.ndim == 0:
        raise ValueError(f"{fn}: input_x needs at least one dimension, got a 0-d array")
    return staged.array.shape[0]


def _axis(value: int, ndim: int, argument: str, fn: str) -> int:
    """A dimension index in ``-ndim .. ndim-1``, normalised to ``0 .. ndim-1``."""
    if not -ndim <= value < ndim:
        raise ValueError(f"{fn}: {argument}={value} is out of range for a {ndim}-d input "
                         f"(expected {-ndim} .. {ndim - 1})")
    return value % ndim


class AllReduce(_Operator):
    """Reduce the input across the group; every member gets the result (``mindspore.ops.AllReduce``).

    Args:
        op: a ``ReduceOp`` or its name (``"sum"``, ``"prod"``, ``"max"``, ``"min"``...).
        group: a group name (str) or ``Group``.

    Raises:
        TypeError: ``op`` or ``group`` of the wrong type; at call, a bool or non-array input.
        ValueError: an unknown op name; at call, an op the dtype does not support.
    """

    def __init__(self, op: ReduceOpLike = ReduceOp.SUM, group: str | Group = WORLD) -> None:
        super().__init__(group)
        self.op = _reduce_op(op, self._fn)

    def __call__(self, input_x: Any) -> Any:
        """Return the reduction of every member's ``input_x`` (same shape and dtype)."""
        group = self._resolve()
        staged = self._input(input_x)
        _reducible(staged, self.op, self._fn)
        out = _copy(staged)
        collectives.all_reduce(group, out, self.op, False)
        return self._new(staged, out)


class AllGather(_Operator):
    """Concatenate every member's input along dim 0, in rank order (``mindspore.ops.AllGather``).

    Every member passes the same shape; for different dim-0 sizes use ``tensorcomm.all_gather_v``.

    Args:
        group: a group name (str) or ``Group``.
    """

    def __init__(self, group: str | Group = WORLD) -> None:
        super().__init__(group)

    def __call__(self, input_x: Any) -> Any:
        """Return an array of shape ``(size * x_1, x_2, ...)``."""
        group = self._resolve()
        staged = self._input(input_x)
        rows = _rows(staged, self._fn)
        out = np.empty((group.size * rows, *staged.array.shape[1:]), staged.array.dtype)
        collectives.all_gather(group, np.ascontiguousarray(staged.array), out,
                               [out.size // group.size] * group.size, False)
        return self._new(staged, out)


class ReduceScatter(_Operator):
    """Reduce across the group and give member i the i-th dim-0 block (``mindspore.ops.ReduceScatter``).

    Args:
        op: as ``AllReduce``.
        group: a group name (str) or ``Group``.
    """

    def __init__(self, op: ReduceOpLike = ReduceOp.SUM, group: str | Group = WORLD) -> None:
        super().__init__(group)
        self.op = _reduce_op(op, self._fn)

    def __call__(self, input_x: Any) -> Any:
        """Return this member's block, of shape ``(x_1 / size, x_2, ...)``.

        Raises:
            ValueError: dim 0 is not divisible by the group size.
        """
        group = self._resolve()
        staged = self._input(input_x)
        _reducible(staged, self.op, self._fn)
        rows = _rows(staged, self._fn)
        if rows % group.size:
            raise ValueError(f"{self._fn}: dim 0 of input_x ({staged.signature}) is not divisible "
                             f"by the group size ({group.size})")
        x = np.ascontiguousarray(staged.array)
        out = np.empty((rows // group.size, *staged.array.shape[1:]), staged.array.dtype)
        collectives.reduce_scatter(group, x, out, [out.size] * group.size, self.op, False)
        return self._new(staged, out)


class Broadcast(_Operator):
    """Copy ``root_rank``'s tensors to every member (``mindspore.ops.Broadcast``).

    Args:
        root_rank: global rank whose tensors are sent.
        group: a group name (str) or ``Group``.

    Raises:
        TypeError: ``root_rank`` is not an int; a bad ``group``.
    """

    def __init__(self, root_rank: int, group: str | Group = WORLD) -> None:
        super().__init__(group)
        self.root_rank = validate.integer(root_rank, "root_rank", self._fn)

    def __call__(self, input_x: Sequence[Any]) -> tuple[Any, ...]:
        """Return a tuple of new arrays holding the root's values, one per input.

        Every member passes a tuple of arrays shaped like the root's; only the root's values count.

        Raises:
            TypeError: ``input_x`` is not a tuple or list of arrays.
            ValueError: ``root_rank`` is not a member of the group.
        """
        group = self._resolve()
        root = validate.rank(self.root_rank, "root_rank", self._fn, group)
        if not isinstance(input_x, (tuple, list)):
            raise TypeError(f"{self._fn}: input_x must be a tuple of arrays, got {type(input_x).__name__}")
        staged = [self._input(x, f"input_x[{i}]") for i, x in enumerate(input_x)]
        outputs = [_copy(s) for s in staged]
        for out in outputs:
            collectives.broadcast(group, out, root, False)
        return tuple(self._new(s, o) for s, o in zip(staged, outputs, strict=True))


class AlltoAll(_Operator):
    """Split along ``split_dim``, send block i to member i, concatenate along ``concat_dim``.

    As ``mindspore.ops.AlltoAll``: the output has ``split_dim`` divided by ``split_count`` and
    ``concat_dim`` multiplied by it; received blocks are concatenated in source-rank order.
    Negative dims count from the end.

    Args:
        split_count: number of blocks; must equal the group size.
        split_dim: the dimension to split.
        concat_dim: the dimension to concatenate along.
        group: a group name (str) or ``Group``.

    Raises:
        TypeError: a non-int count or dim; a bad ``group``.
        ValueError: ``split_count`` is not positive.
    """

    def __init__(self, split_count: int, split_dim: int, concat_dim: int,
                 group: str | Group = WORLD) -> None:
        super().__init__(group)
        self.split_count = validate.integer(split_count, "split_count", self._fn)
        if self.split_count <= 0:
            raise ValueError(f"{self._fn}: split_count must be positive, got {split_count}")
        self.split_dim = validate.integer(split_dim, "split_dim", self._fn)
        self.concat_dim = validate.integer(concat_dim, "concat_dim", self._fn)

    def __call__(self, input_x: Any) -> Any:
        """Return the exchanged array.

        Raises:
            ValueError: ``split_count`` differs from the group size, a dim is out of range, or
                ``input_x.shape[split_dim]`` is not divisible by ``split_count``.
        """
        group = self._resolve()
        staged = self._input(input_x)
        x, n = staged.array, self.split_count
        if n != group.size:
            raise ValueError(f"{self._fn}: split_count ({n}) must equal the group size ({group.size})")
        split = _axis(self.split_dim, x.ndim, "split_dim", self._fn)
        concat = _axis(self.concat_dim, x.ndim, "concat_dim", self._fn)
        if x.shape[split] % n:
            raise ValueError(f"{self._fn}: input_x.shape[{self.split_dim}] ({x.shape[split]}) is not "
                             f"divisible by split_count ({n})")
        block = (*x.shape[:split], x.shape[split] // n, *x.shape[split + 1:])
        # Block i = x[..., i*b:(i+1)*b, ...] along split: expose it as a leading axis of n blocks.
        send = np.ascontiguousarray(np.moveaxis(x.reshape((*block[:split], n, *block[split:])), split, 0))
        recv = np.empty_like(send)
        counts = [int(np.prod(block))] * n
        collectives.all_to_all(group, send, counts, recv, counts, False)
        # Put the source axis just before concat_dim and merge the two: concatenation in rank order.
        out_shape = (*block[:concat], n * block[concat], *block[concat + 1:])
        return self._new(staged, np.moveaxis(recv, 0, concat).reshape(out_shape))


class Scan(_Operator):
    """Inclusive prefix reduction (MPI's ``Scan``): group rank ``r`` gets the reduction of ranks
    ``0..r``' inputs as a new array; the input is left as it is.

    Ops and dtypes as ``tensorcomm.scan`` (bool inputs are refused, as ``AllReduce`` refuses them).

    Args:
        op: as ``AllReduce``.
        group: a group name (str) or ``Group``.
    """

    _inclusive = True

    def __init__(self, op: ReduceOpLike = ReduceOp.SUM, group: str | Group = WORLD) -> None:
        super().__init__(group)
        self.op = _reduce_op(op, self._fn)

    def __call__(self, input_x: Any) -> Any:
        """Return the prefix reduction (same shape and dtype); ``Exscan`` returns None on group
        rank 0, whose exclusive prefix is empty."""
        group = self._resolve()
        staged = self._input(input_x)
        _reducible(staged, self.op, self._fn)
        out = _copy(staged)
        collectives.scan(group, out, self.op, self._inclusive, False, self._fn)
        if not self._inclusive and group.rank == 0:
            return None
        return self._new(staged, out)


class Exscan(Scan):
    """Exclusive prefix reduction (MPI's ``Exscan``): group rank ``r > 0`` gets the reduction of
    ranks ``0..r-1``' inputs as a new array, group rank 0 gets None (as mpi4py's ``exscan``).

    Args:
        op: as ``AllReduce``.
        group: a group name (str) or ``Group``.
    """

    _inclusive = False
