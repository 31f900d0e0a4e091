"""MindSpore ``ops`` style, uneven exchanges: ``AlltoAllV`` and ``NeighborExchange``.

Operators with per-peer sizes, on the same base as ``operators.py`` (new arrays out, the input
untouched, group as a name or ``Group``, global ranks). Both run as one all-to-all with element
counts per member; a member that exchanges nothing with another sends an empty block.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core import collectives
from ..core.group import Group
from ..core.lifecycle import WORLD
from . import uneven, validate
from .operators import _Operator


def _counts(value: Any, argument: str, fn: str, length: int) -> list[int]:
    """A list of ``length`` non-negative ints."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{fn}: {argument} must be a list of ints, got {type(value).__name__}")
    counts = [validate.integer(v, f"{argument}[{i}]", fn) for i, v in enumerate(value)]
    if len(counts) != length or any(c < 0 for c in counts):
        raise ValueError(f"{fn}: {argument} must hold {length} non-negative ints (one per member), "
                         f"got {counts}")
    return counts



class AlltoAllV(_Operator):
    """Uneven all-to-all of a flat array (``mindspore.ops.AlltoAllV``).

    Args:
        group: a group name (str) or ``Group``.
        block_size: elements per unit of ``send_numel_list`` / ``recv_numel_list``.

    Raises:
        TypeError: a non-int ``block_size``; a bad ``group``.
        ValueError: ``block_size`` is not positive.
    """

    def __init__(self, group: str | Group = WORLD, block_size: int = 1) -> None:
        super().__init__(group)
        self.block_size = validate.integer(block_size, "block_size", self._fn)
        if self.block_size <= 0:
            raise ValueError(f"{self._fn}: block_size must be positive, got {block_size}")

    def __call__(self, input_x: Any, send_numel_list: Sequence[int],
                 recv_numel_list: Sequence[int] | None = None) -> Any:
        """Send ``send_numel_list[i]`` units to member i; return what arrives, concatenated (1-D).

        ``recv_numel_list=None`` (an extension of MindSpore's API) exchanges the sizes first.

        Raises:
            ValueError: ``input_x`` is not 1-D, or a list does not match the group size or the input.
        """
        group = self._resolve()
        staged = self._input(input_x)
        if staged.array.ndim != 1:
            raise ValueError(f"{self._fn}: input_x must be 1-D (flatten it first), got {staged.signature}")
        if staged.array.size % self.block_size:
            raise ValueError(f"{self._fn}: input_x ({staged.signature}) is not a whole number of "
                             f"blocks of {self.block_size}")
        units = np.ascontiguousarray(staged.array).reshape(-1, self.block_size)
        send = validate.split_sizes(send_numel_list, "send_numel_list", self._fn, group.size, units.shape[0])
        if recv_numel_list is None:
            out, _ = uneven.exchange(group, units, send, self._fn)
            return self._new(staged, out.reshape(-1))
        recv = _counts(recv_numel_list, "recv_numel_list", self._fn, group.size)
        out = np.empty(sum(recv) * self.block_size, staged.array.dtype)
        collectives.all_to_all(group, units, [s * self.block_size for s in send], out,
                               [r * self.block_size for r in recv], False)
        return self._new(staged, out)


class NeighborExchange(_Operator):
    """Send tensors to some ranks and receive tensors from others (``mindspore.ops.NeighborExchange``).

    A collective: every member of the group calls it, with its own lists (possibly empty). It runs
    as one all-to-all in which non-neighbours exchange empty blocks.

    Args:
        send_rank_ids: global ranks to send to, one per input tensor, no repeats.
        recv_rank_ids: global ranks to receive from, no repeats.
        recv_shapes: the shape received from each of ``recv_rank_ids``.
        send_shapes: the shape of each input tensor.
        recv_type: the dtype of every tensor sent and received.
        group: a group name (str) or ``Group``.

    Raises:
        TypeError: a list, shape or rank of the wrong type; an unknown ``recv_type``; a bad group.
        ValueError: repeated ranks, or shapes that do not match their rank lists.
    """

    def __init__(self, send_rank_ids: Sequence[int], recv_rank_ids: Sequence[int],
                 recv_shapes: Sequence[Sequence[int]], send_shapes: Sequence[Sequence[int]],
                 recv_type: Any, group: str | Group = WORLD) -> None:
        super().__init__(group)
        fn = self._fn
        self.send_rank_ids = _ids(send_rank_ids, "send_rank_ids", fn)
        self.recv_rank_ids = _ids(recv_rank_ids, "recv_rank_ids", fn)
        self.send_shapes = _shapes(send_shapes, "send_shapes", fn, len(self.send_rank_ids))
        self.recv_shapes = _shapes(recv_shapes, "recv_shapes", fn, len(self.recv_rank_ids))
        try:
            self.recv_type = np.dtype(recv_type)
        except TypeError:
            raise TypeError(f"{fn}: recv_type must be a dtype, got {recv_type!r}") from None

    def __call__(self, input_x: Sequence[Any]) -> tuple[Any, ...]:
        """Send ``input_x[k]`` to ``send_rank_ids[k]``; return what each of ``recv_rank_ids`` sent.

        Raises:
            TypeError: ``input_x`` is not a tuple of arrays of ``recv_type``.
            ValueError: its length or shapes differ from ``send_shapes``; a rank outside the group.
        """
        group, fn = self._resolve(), self._fn
        if not isinstance(input_x, (tuple, list)):
            raise TypeError(f"{fn}: input_x must be a tuple of arrays, got {type(input_x).__name__}")
        if len(input_x) != len(self.send_rank_ids):
            raise ValueError(f"{fn}: input_x holds {len(input_x)} arrays for "
                             f"{len(self.send_rank_ids)} send_rank_ids")
        staged = [self._input(x, f"input_x[{i}]") for i, x in enumerate(input_x)]
        for i, s in enumerate(staged):
            if s.array.dtype != self.recv_type:
                raise TypeError(f"{fn}: input_x[{i}] is {s.signature}; every tensor must be recv_type "
                                f"({self.recv_type})")
            if s.array.shape != self.send_shapes[i]:
                raise ValueError(f"{fn}: input_x[{i}] is {s.signature} but send_shapes[{i}] is "
                                 f"{list(self.send_shapes[i])}")
        dests = [validate.rank(r, "send_rank_ids", fn, group) for r in self.send_rank_ids]
        sources = [validate.rank(r, "recv_rank_ids", fn, group) for r in self.recv_rank_ids]
        send_counts, recv_counts = [0] * group.size, [0] * group.size
        for dest, s in zip(dests, staged, strict=True):
            send_counts[dest] = s.array.size
        for source, shape in zip(sources, self.recv_shapes, strict=True):
            recv_counts[source] = int(np.prod(shape))
        # The all-to-all wants blocks in destination order; ``sorted`` pairs each with its tensor.
        order = sorted(range(len(dests)), key=dests.__getitem__)
        send = np.concatenate([np.ravel(staged[k].array) for k in order] or [np.empty(0, self.recv_type)])
        out = np.empty(sum(recv_counts), self.recv_type)
        collectives.all_to_all(group, send, send_counts, out, recv_counts, False)
        offsets = np.concatenate(([0], np.cumsum(recv_counts)))
        like = staged[0] if staged else None
        results = [out[offsets[s]:offsets[s + 1]].reshape(shape)
                   for s, shape in zip(sources, self.recv_shapes, strict=True)]
        return tuple(self._new(like, r) if like else r for r in results)


def _ids(value: Any, argument: str, fn: str) -> list[int]:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{fn}: {argument} must be a list of ints, got {type(value).__name__}")
    ids = [validate.integer(v, f"{argument}[{i}]", fn) for i, v in enumerate(value)]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{fn}: {argument} must not repeat a rank, got {ids}")
    return ids


def _shapes(value: Any, argument: str, fn: str, length: int) -> list[tuple[int, ...]]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, (list, tuple)) for s in value):
        raise TypeError(f"{fn}: {argument} must be a list of shapes (lists of ints), got {value!r}")
    if len(value) != length:
        raise ValueError(f"{fn}: {argument} must hold {length} shapes (one per rank id), got {len(value)}")
    shapes = [tuple(validate.integer(d, f"{argument}[{i}]", fn) for d in s) for i, s in enumerate(value)]
    if any(d < 0 for s in shapes for d in s):
        raise ValueError(f"{fn}: {argument} must not hold negative sizes, got {shapes}")
    return shapes
