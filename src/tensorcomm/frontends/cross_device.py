"""tf.distribute ``CrossDeviceOps`` style: strategy objects that reduce and broadcast values.

A *value* is one array or a list of arrays, the local replicas one process holds (as the
per-device components of a TF ``PerReplica``); replicas are summed locally first, then across
processes, and MEAN divides by the number of replicas in all processes together.

*Destinations* say which processes receive the result; every process of the strategy's group
calls with the same destinations:

* ``None`` or ``"all"``: every process (an all-reduce);
* an ``int``: that global rank only;
* a list or tuple of global ranks: those ranks.

Processes outside the destinations take part in the communication and get ``None`` back. A
strategy's ``group`` (a ``Group``, a registered group name, or ``None`` for the world) says which
processes take part.

A value may also be an ``IndexedSlices`` (rows of a dense array, as TF's ``tf.IndexedSlices``) or
a list of them: every strategy sums those across processes with ``sparse_all_reduce``, so every
process gets the coalesced rows (each row once, sorted, repeats summed), and processes outside the
destinations get ``None``.

TensorFlow's own objects work as TF programs spell them (``tf_values.py``; TensorFlow is never
imported by tensorcomm): ``tf.distribute.ReduceOp.SUM``/``MEAN`` as the op, ``tf.Tensor`` and
``tf.Variable`` (its current value) values, which come back as new ``tf.Tensor``s, and
``tf.IndexedSlices``, which come back as coalesced ``tf.IndexedSlices``.

Strategies: ``ReductionToOneDevice`` reduces onto one rank and broadcasts from there;
``AllReduceCrossDeviceOps(num_packs)`` and ``CollectiveAllReduce(bytes_per_pack)`` all-reduce
batches fused into packs (``packing.py``) and fall back to reduce-to-one when the destinations
are not every process, as TF's all-reduce strategies do.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..algorithms import kernels
from ..core import collectives
from ..core.group import Group
from ..types import ReduceOp as CoreReduceOp
from . import packing, tf_values, validate
from .arrays import Staged
from .sparse import sparse_all_reduce

Destinations = Any  # None | "all" | int | Sequence[int]; see the module docstring


class ReduceOp(enum.Enum):
    """How a cross-device reduction combines values, as ``tf.distribute.ReduceOp``: ``SUM`` or
    ``MEAN``."""

    SUM = "SUM"
    MEAN = "MEAN"

    @classmethod
    def parse(cls, value: Any, argument: str = "reduce_op") -> ReduceOp:
        """Normalise a ``ReduceOp``, ``tf.distribute.ReduceOp``, ``"sum"``/``"mean"`` (any case) or
        ``tensorcomm.ReduceOp.SUM/AVG``.

        Raises:
            TypeError: ``value`` is none of those types.
            ValueError: the name or the ``tensorcomm.ReduceOp`` is not SUM or MEAN.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, CoreReduceOp):
            if value is CoreReduceOp.SUM:
                return cls.SUM
            if value is CoreReduceOp.AVG:
                return cls.MEAN
            raise ValueError(f"{argument}: cross-device reductions support SUM and MEAN (AVG), "
                             f"got {value}")
        if isinstance(value, str):
            try:
                return cls(value.upper())
            except ValueError:
                raise ValueError(f"{argument}: expected 'sum' or 'mean', got {value!r}") from None
        name = tf_values.op_name(value)
        if name is not None:
            return cls(name)
        raise TypeError(f"{argument}: expected a tensorcomm.cross_device.ReduceOp, a "
                        f"tf.distribute.ReduceOp or 'sum'/'mean', got {type(value).__name__}")


def _result(like: Staged, tf: bool, array: np.ndarray) -> Any:
    """``array`` as an array of ``like``'s kind (a ``tf.Tensor`` for TensorFlow's values)."""
    return tf_values.tensor(array) if tf else like.adapter.new_like(like.obj, array)


def _stage(value: Any, argument: str, fn: str) -> Staged:
    """An array argument; a ``tf.Tensor`` or ``tf.Variable`` is read into numpy first."""
    return validate.array(tf_values.to_numpy(value, argument, fn) if tf_values.is_tf(value) else value,
                          argument, fn)


@dataclass
class _Value:
    """One validated value: its local replicas summed into a fresh array, and how to return it."""

    summed: np.ndarray  # C-contiguous, owned: collectives may reduce it in place
    replicas: int
    like: Staged  # the first replica; results are returned as arrays of its kind
    tf: bool  # the first replica is TensorFlow's: results are tf.Tensors

    def result(self, array: np.ndarray | None) -> Any:
        return None if array is None else _result(self.like, self.tf, array)


@dataclass(frozen=True)
class IndexedSlices:
    """Some rows of a dense array of shape ``dense_shape``, as TF's ``tf.IndexedSlices``.

    Attributes:
        values: an array of shape ``(len(indices), *dense_shape[1:])``; ``values[i]`` is row
            ``indices[i]``.
        indices: a 1-d integer array of row numbers; rows may repeat (their values add up).
        dense_shape: the dense array's shape.
    """

    values: Any
    indices: Any
    dense_shape: Sequence[int]


@dataclass
class _Slices:
    """One validated ``IndexedSlices`` value: its local replicas concatenated."""

    indices: np.ndarray
    values: np.ndarray
    dense_shape: tuple[int, ...]
    replicas: int
    like: Staged  # the first replica's values: results come back as arrays of its kind
    tf: bool  # the first replica is a tf.IndexedSlices: so is the result


def _slices_kind(value: Any) -> bool:
    return isinstance(value, IndexedSlices) or tf_values.is_slices(value)


def _is_slices(value: Any) -> bool:
    return _slices_kind(value) or (
        isinstance(value, (list, tuple)) and bool(value) and _slices_kind(value[0]))


def _dense_shape(replica: Any, argument: str, fn: str) -> tuple[int, ...]:
    shape = replica.dense_shape
    if shape is None:
        raise ValueError(f"{fn}: {argument}.dense_shape is None; IndexedSlices need their dense shape")
    if tf_values.is_tf(shape):
        shape = tf_values.to_numpy(shape, f"{argument}.dense_shape", fn).tolist()
    return tuple(shape)


def _slices(value: Any, op: ReduceOp, fn: str) -> _Slices:
    replicas = value if isinstance(value, (list, tuple)) else [value]
    if not all(_slices_kind(r) for r in replicas):
        raise TypeError(f"{fn}: a value's replicas must all be IndexedSlices or all arrays, got "
                        f"{[type(r).__name__ for r in replicas]}")
    shapes = {_dense_shape(r, f"value[{i}]", fn) for i, r in enumerate(replicas)}
    if len(shapes) != 1:
        raise ValueError(f"{fn}: a value's IndexedSlices replicas must share one dense_shape, got "
                         f"{sorted(shapes)}")
    values = [_stage(r.values, f"value[{i}].values", fn) for i, r in enumerate(replicas)]
    indices = [_stage(r.indices, f"value[{i}].indices", fn).array for i, r in enumerate(replicas)]
    validate.same_dtype(values, values[0], "value", fn)
    _check_dtype(op, values[0].array.dtype, fn)
    return _Slices(np.concatenate([i.reshape(-1) for i in indices]),
                   np.concatenate([v.array for v in values]), shapes.pop(), len(replicas), values[0],
                   tf_values.is_slices(replicas[0]))


def _reduce_slices(group: Group, value: _Slices, targets: tuple[int, ...] | None,
                   total: int | None) -> Any:
    """Sum ``value`` across ``group`` (divided by ``total`` replicas for MEAN)."""
    indices, summed = sparse_all_reduce(value.indices, value.values, value.dense_shape, group=group)
    if targets is not None and group.rank not in targets:
        return None
    if total is not None:
        summed = np.divide(summed, total, dtype=summed.dtype)
    if value.tf:
        return tf_values.indexed_slices(summed, indices, value.dense_shape)
    return IndexedSlices(value.like.adapter.new_like(value.like.obj, summed), indices, value.dense_shape)


def _check_dtype(op: ReduceOp, dtype: np.dtype, fn: str) -> None:
    """SUM takes what the core's SUM takes; MEAN a float or complex dtype only, as
    tf.distribute's MEAN (the core's AVG also takes integers, rounding as NCCL does)."""
    kernels.check_op_dtype(CoreReduceOp.SUM, dtype, f"{fn}: reduce_op")
    if op is ReduceOp.MEAN and not kernels.floating(dtype):
        raise ValueError(f"{fn}: reduce_op: MEAN is not defined for {dtype}: there is no exact "
                         "integer mean; use SUM and divide, or a floating-point dtype")


def _value(value: Any, op: ReduceOp, fn: str) -> _Value:
    replicas = value if isinstance(value, (list, tuple)) else [value]
    if not replicas:
        raise ValueError(f"{fn}: a value must hold at least one replica, got an empty list")
    staged = [_stage(r, "value" if r is value else f"value[{i}]", fn) for i, r in enumerate(replicas)]
    validate.same_layout(staged, staged[0], "value", fn)
    dtype = staged[0].array.dtype
    _check_dtype(op, dtype, fn)
    if len(staged) == 1:
        summed = np.array(staged[0].array, order="C", copy=True)
    else:
        wide = kernels.accumulation_dtype(CoreReduceOp.SUM, dtype)
        stack = np.stack([s.array for s in staged])
        # np.array, not ascontiguousarray: that one turns 0-d results into 1-d arrays.
        summed = np.array(np.add.reduce(stack, axis=0, dtype=wide), dtype=dtype, order="C")
    return _Value(summed, len(staged), staged[0], tf_values.is_tf(replicas[0]))


def _destinations(value: Destinations, group: Group, fn: str) -> tuple[int, ...] | None:
    """Group ranks of the destinations, or ``None`` for every member."""
    if value is None or (isinstance(value, str) and value == "all"):
        return None
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{fn}: destinations must not be an empty list")
        ranks = tuple(validate.rank(r, f"destinations[{i}]", fn, group) for i, r in enumerate(value))
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"{fn}: destinations must not repeat a rank, got {list(value)}")
        return None if len(ranks) == group.size else ranks
    if isinstance(value, str):
        raise ValueError(f"{fn}: the only destinations string is 'all', got {value!r}")
    ranks = (validate.rank(value, "destinations", fn, group),)
    return None if group.size == 1 else ranks


def _replica_totals(group: Group, values: Sequence[_Value | _Slices]) -> np.ndarray:
    """Replicas per value summed over every process (one small all-reduce for the whole batch)."""
    counts = np.fromiter((v.replicas for v in values), dtype=np.int64, count=len(values))
    collectives.all_reduce(group, counts, CoreReduceOp.SUM, False)
    return counts


def _mean(array: np.ndarray, total: int) -> None:
    np.divide(array, total, out=array, casting="unsafe")


class CrossDeviceOps:
    """Base of the strategies: validates arguments, then runs the subclass's reduction.

    Args:
        group: the processes taking part: a ``Group``, a registered group name, or ``None`` (the world).

    Raises:
        TypeError: ``group`` is none of those.
    """

    def __init__(self, group: Group | str | None = None) -> None:
        if group is not None and not isinstance(group, (Group, str)):
            raise TypeError(f"{type(self).__name__}: group must be a tensorcomm.Group, a group name "
                            f"(str) or None, got {type(group).__name__}")
        self._group = group

    def reduce(self, reduce_op: Any, value: Any, destinations: Destinations = None) -> Any:
        """Reduce ``value`` (one array or a list of local replicas) across processes.

        Args:
            reduce_op: ``ReduceOp.SUM``/``MEAN`` or ``"sum"``/``"mean"``.
            value: an array, or a list of same-shaped arrays (this process's replicas); or an
                ``IndexedSlices``, or a list of them.
            destinations: who receives the result (see the module docstring).

        Returns:
            A new array of the first replica's kind on destination ranks (a ``tf.Tensor`` for
            TensorFlow's tensors and variables), ``None`` elsewhere; for ``IndexedSlices``, a new
            coalesced ``IndexedSlices`` of the first replica's class (int64 indices).

        Raises:
            TypeError: a non-array value, or a bad ``reduce_op`` or destination type.
            ValueError: replicas that differ in shape or dtype, MEAN of integers, a destination
                outside the group.
        """
        return self._run(f"{type(self).__name__}.reduce", reduce_op, [(value, destinations)])[0]

    def batch_reduce(self, reduce_op: Any, value_destination_pairs: Any) -> list[Any]:
        """Reduce several values at once; results come back in input order.

        Args:
            reduce_op: as in ``reduce``.
            value_destination_pairs: a list of ``(value, destinations)`` pairs.

        Returns:
            One result per pair, as ``reduce`` returns it.

        Raises:
            ValueError: ``value_destination_pairs`` is not a list of pairs; as ``reduce`` otherwise.
        """
        return self._run(f"{type(self).__name__}.batch_reduce", reduce_op, value_destination_pairs)

    def _run(self, fn: str, reduce_op: Any, value_destination_pairs: Any) -> list[Any]:
        group = validate.group(self._group, fn)
        op = ReduceOp.parse(reduce_op, f"{fn}: reduce_op")
        if not isinstance(value_destination_pairs, (list, tuple)) or not all(
                isinstance(p, (list, tuple)) and len(p) == 2 for p in value_destination_pairs):
            raise ValueError(f"{fn}: value_destination_pairs must be a list of (value, destinations) "
                             "pairs")
        values: list[_Value | _Slices] = [_slices(v, op, fn) if _is_slices(v) else _value(v, op, fn)
                                          for v, _ in value_destination_pairs]
        targets = [_destinations(d, group, fn) for _, d in value_destination_pairs]
        if not values:
            return []
        totals = _replica_totals(group, values) if op is ReduceOp.MEAN else None
        dense = {i: v for i, v in enumerate(values) if isinstance(v, _Value)}
        reduced = dict(zip(dense, self._reduce_batch(group, list(dense.values()),
                                                     [targets[i] for i in dense]), strict=True)) \
            if dense else {}
        results: list[Any] = []
        for i, value in enumerate(values):
            total = None if totals is None else int(totals[i])
            if isinstance(value, _Slices):
                results.append(_reduce_slices(group, value, targets[i], total))
                continue
            array = reduced[i]
            if total is not None and array is not None:
                _mean(array, total)
            results.append(value.result(array))
        return results

    def broadcast(self, tensor: Any, destinations: Destinations = None, src: int = 0) -> Any:
        """Copy global rank ``src``'s ``tensor`` to the destination processes.

        Every process passes a ``tensor`` of the same shape and dtype; only ``src``'s values count.

        Returns:
            A new array of ``tensor``'s kind (a ``tf.Tensor`` for TensorFlow's) on destination
            ranks, ``None`` elsewhere.

        Raises:
            TypeError: a non-array tensor, a non-int ``src``.
            ValueError: ``src`` or a destination outside the group.
        """
        fn = f"{type(self).__name__}.broadcast"
        group = validate.group(self._group, fn)
        root = validate.rank(src, "src", fn, group)
        staged = _stage(tensor, "tensor", fn)
        targets = _destinations(destinations, group, fn)
        buf = np.array(staged.array, order="C", copy=True)
        if targets != (root,):  # sending to nobody but oneself needs no message
            collectives.broadcast(group, buf, root, False)
        mine = targets is None or group.rank in targets
        return _result(staged, tf_values.is_tf(tensor), buf) if mine else None

    def _reduce_batch(self, group: Group, values: list[_Value],
                      targets: list[tuple[int, ...] | None]) -> list[np.ndarray | None]:
        """Sum each value across the group; ``None`` where this rank is not a destination."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(group={self._group!r})"


def _reduce_to_one(group: Group, value: _Value, targets: tuple[int, ...] | None,
                   root: int) -> np.ndarray | None:
    """Sum onto group rank ``root``, then broadcast to the other destinations if there are any."""
    buf = value.summed
    collectives.reduce(group, buf, root, CoreReduceOp.SUM, False)
    if targets != (root,):
        collectives.broadcast(group, buf, root, False)
    return buf if targets is None or group.rank in targets else None


class ReductionToOneDevice(CrossDeviceOps):
    """Reduce onto one rank, then broadcast the result to the destinations.

    Args:
        reduce_to_rank: global rank that reduces (default: the first destination, or the group's
            first member when the destinations are everyone).
        group: as ``CrossDeviceOps``.

    Raises:
        TypeError: ``reduce_to_rank`` is not an int or ``None``; a bad ``group``.
    """

    def __init__(self, reduce_to_rank: int | None = None, group: Group | str | None = None) -> None:
        super().__init__(group)
        if reduce_to_rank is not None:
            validate.integer(reduce_to_rank, "reduce_to_rank", type(self).__name__)
        self.reduce_to_rank = reduce_to_rank

    def _reduce_batch(self, group: Group, values: list[_Value],
                      targets: list[tuple[int, ...] | None]) -> list[np.ndarray | None]:
        if self.reduce_to_rank is None:
            roots = [0 if t is None else t[0] for t in targets]
        else:
            root = validate.rank(self.reduce_to_rank, "reduce_to_rank", type(self).__name__, group)
            roots = [root] * len(values)
        return [_reduce_to_one(group, v, t, r) for v, t, r in zip(values, targets, roots, strict=True)]


class _PackedAllReduce(CrossDeviceOps):
    """All-reduce of packs; pairs whose destinations are not everyone fall back to reduce-to-one."""

    def _layouts(self, arrays: Sequence[np.ndarray]) -> list[packing.Layout]:
        raise NotImplementedError

    def _reduce_batch(self, group: Group, values: list[_Value],
                      targets: list[tuple[int, ...] | None]) -> list[np.ndarray | None]:
        if any(t is not None for t in targets):
            # As TF: a batch that is not all all-reduces is reduced value by value.
            return [self._all_reduce(group, [v])[0] if t is None else _reduce_to_one(group, v, t, t[0])
                    for v, t in zip(values, targets, strict=True)]
        return self._all_reduce(group, values)

    def _all_reduce(self, group: Group, values: list[_Value]) -> list[np.ndarray | None]:
        arrays = [v.summed for v in values]
        shapes = [a.shape for a in arrays]
        reduced: dict[int, np.ndarray] = {}
        for layout in self._layouts(arrays):
            buffer = layout.pack(arrays)
            for piece in layout.packs(buffer):
                collectives.all_reduce(group, piece, CoreReduceOp.SUM, False)
            reduced.update(layout.unpack(buffer, shapes))
        return [reduced[i] for i in range(len(values))]


class AllReduceCrossDeviceOps(_PackedAllReduce):
    """All-reduce a batch fused into ``num_packs`` packs per dtype (tf ``NcclAllReduce(num_packs)``).

    ``num_packs=0`` all-reduces every value on its own; ``k > 0`` flattens and concatenates the
    values of each dtype and cuts them into ``k`` packs of ``total // k`` elements, the last taking
    the remainder.

    Args:
        num_packs: a non-negative integer.
        group: as ``CrossDeviceOps``.

    Raises:
        TypeError: ``num_packs`` is not an int; a bad ``group``.
        ValueError: ``num_packs`` is negative.
    """

    def __init__(self, num_packs: int = 1, group: Group | str | None = None) -> None:
        super().__init__(group)
        self.num_packs = packing.check_count(num_packs, "num_packs")

    def _layouts(self, arrays: Sequence[np.ndarray]) -> list[packing.Layout]:
        return packing.by_num_packs(arrays, self.num_packs)


class CollectiveAllReduce(_PackedAllReduce):
    """All-reduce a batch in packs of about ``bytes_per_pack`` bytes (tf ``CollectiveAllReduce``).

    Values of each dtype are walked in reverse order and a pack is closed once it holds more than
    ``bytes_per_pack`` bytes; ``0`` puts every value of a dtype in one pack.

    Args:
        bytes_per_pack: a non-negative integer.
        group: as ``CrossDeviceOps``.

    Raises:
        TypeError: ``bytes_per_pack`` is not an int; a bad ``group``.
        ValueError: ``bytes_per_pack`` is negative.
    """

    def __init__(self, bytes_per_pack: int = 0, group: Group | str | None = None) -> None:
        super().__init__(group)
        self.bytes_per_pack = packing.check_count(bytes_per_pack, "bytes_per_pack")

    def _layouts(self, arrays: Sequence[np.ndarray]) -> list[packing.Layout]:
        return packing.by_bytes_per_pack(arrays, self.bytes_per_pack)
