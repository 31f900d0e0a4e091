"""Fuse many arrays into a few contiguous packs and back: the layout half of packed reductions.

Pure numpy, no communication, so the layout rules are unit-tested on their own
(tests/unit/test_packing.py). Arrays are grouped by dtype (a pack is one flat buffer, so it has one
dtype); within a dtype the two rules are TensorFlow's:

* ``num_packs`` (``tf.distribute.NcclAllReduce`` / ``AllReduceCrossDeviceOps``): flatten the values
  in order, concatenate them and cut the result into ``k`` packs of ``total // k`` elements, the last
  one taking the remainder. ``0`` means no packing: every value is a pack of its own.
* ``bytes_per_pack`` (``CollectiveAllReduce`` with ``CommunicationOptions``): walk the values in
  *reverse* order (gradients are produced back to front, so the first pack is ready first) and open
  a new pack once the current one holds more than ``bytes_per_pack`` bytes, so packs err on the
  large side and never split a value. ``0`` puts every value of the dtype in one pack.

Empty packs (``num_packs`` larger than the element count) are dropped: they would only cost a
message. Every rank derives the same layout from the same shapes and dtypes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np


@dataclass(frozen=True)
class Layout:
    """One dtype's share of a batch: which values, where each sits in the flat buffer, the packs.

    Attributes:
        dtype: the element type of every value in this layout.
        indices: positions of the values in the batch, in buffer order.
        offsets: ``len(indices) + 1`` element offsets; value ``k`` is ``buffer[offsets[k]:offsets[k+1]]``.
        bounds: pack boundaries; pack ``p`` is ``buffer[bounds[p]:bounds[p+1]]`` (never empty).
    """

    dtype: np.dtype
    indices: tuple[int, ...]
    offsets: tuple[int, ...]
    bounds: tuple[int, ...]

    def pack(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        """A fresh flat buffer holding this layout's values of ``arrays`` back to back."""
        buffer = np.empty(self.offsets[-1], dtype=self.dtype)
        for k, index in enumerate(self.indices):
            buffer[self.offsets[k]:self.offsets[k + 1]] = np.ravel(arrays[index])
        return buffer

    def packs(self, buffer: np.ndarray) -> list[np.ndarray]:
        """The packs of ``buffer``, as contiguous views (reducing them in place fills ``buffer``)."""
        return [buffer[start:stop] for start, stop in pairwise(self.bounds)]

    def unpack(self, buffer: np.ndarray, shapes: Sequence[tuple[int, ...]]) -> dict[int, np.ndarray]:
        """Batch position -> that value's part of ``buffer``, reshaped to ``shapes[position]``."""
        return {index: buffer[self.offsets[k]:self.offsets[k + 1]].reshape(shapes[index])
                for k, index in enumerate(self.indices)}


def check_count(value: int, argument: str) -> int:
    """Validate ``num_packs`` / ``bytes_per_pack``: a non-negative int, returned as ``int``.

    Raises:
        TypeError: ``value`` is not an int (bool included).
        ValueError: ``value`` is negative.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{argument} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{argument} must be a non-negative integer, got {value}")
    return int(value)


def _by_dtype(arrays: Sequence[np.ndarray]) -> dict[np.dtype, list[int]]:
    """Batch positions per dtype, dtypes in order of first appearance."""
    groups: dict[np.dtype, list[int]] = {}
    for index, array in enumerate(arrays):
        groups.setdefault(array.dtype, []).append(index)
    return groups


def _offsets(arrays: Sequence[np.ndarray], indices: Sequence[int]) -> tuple[int, ...]:
    sizes = np.fromiter((arrays[i].size for i in indices), dtype=np.int64, count=len(indices))
    return tuple(int(o) for o in np.concatenate(([0], np.cumsum(sizes))))


def _nonempty(bounds: np.ndarray) -> tuple[int, ...]:
    """``bounds`` without the boundaries that would delimit empty packs."""
    unique = np.unique(bounds)  # sorted; repeated boundaries are the empty packs
    return tuple(int(b) for b in unique) if unique.size > 1 else (int(unique[0]),)


def by_num_packs(arrays: Sequence[np.ndarray], num_packs: int) -> list[Layout]:
    """Layouts for TF's ``num_packs`` rule (see the module docstring), one per dtype.

    Raises:
        TypeError: ``num_packs`` is not an int.
        ValueError: ``num_packs`` is negative.
    """
    num_packs = check_count(num_packs, "num_packs")
    layouts = []
    for dtype, indices in _by_dtype(arrays).items():
        offsets = _offsets(arrays, indices)
        total = offsets[-1]
        if num_packs == 0:
            bounds = np.asarray(offsets)
        else:
            bounds = np.append(np.arange(num_packs) * (total // num_packs), total)
        layouts.append(Layout(dtype, tuple(indices), offsets, _nonempty(bounds)))
    return layouts


def by_bytes_per_pack(arrays: Sequence[np.ndarray], bytes_per_pack: int) -> list[Layout]:
    """Layouts for TF's ``bytes_per_pack`` rule (see the module docstring), one per dtype.

    Raises:
        TypeError: ``bytes_per_pack`` is not an int.
        ValueError: ``bytes_per_pack`` is negative.
    """
    limit = check_count(bytes_per_pack, "bytes_per_pack")
    layouts = []
    for dtype, forward in _by_dtype(arrays).items():
        indices = forward[::-1]
        offsets = _offsets(arrays, indices)
        bounds = [0]
        if limit:
            # Greedy over whole values, as TF's group_by_size: a pack closes once it is over the limit.
            for start in offsets[1:-1]:
                if (start - bounds[-1]) * dtype.itemsize > limit:
                    bounds.append(start)
        bounds.append(offsets[-1])
        layouts.append(Layout(dtype, tuple(indices), offsets, _nonempty(np.asarray(bounds))))
    return layouts
