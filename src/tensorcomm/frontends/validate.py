"""Argument checks shared by every frontend: each raises TypeError/ValueError at once, naming the
function, the argument, what was expected and what was given."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.group import Group
from ..core.lifecycle import current_world
from ..errors import ArgumentMismatchError
from .arrays import Staged


def _type_name(value: Any) -> str:
    return type(value).__name__


def group(value: Any, fn: str) -> Group:
    """Resolve ``None`` / a ``Group`` / a registered name to a group this process belongs to."""
    if value is None:
        return current_world().world_group  # every process belongs to it
    if isinstance(value, Group):
        resolved = value._target()
    elif isinstance(value, str):
        resolved = current_world().named_group(value)
    else:
        raise TypeError(f"{fn}: group must be a tensorcomm.Group, a group name (str) or None, "
                        f"got {_type_name(value)}")
    if not resolved.is_member:
        raise ValueError(f"{fn}: this process (global rank {resolved._world.rank}) is not a member "
                         f"of group {resolved.name!r} (ranks {list(resolved.ranks)})")
    return resolved


def flag(value: Any, argument: str, fn: str) -> bool:
    """A strict bool (``async_op`` and friends)."""
    if value is not False and value is not True:
        raise TypeError(f"{fn}: {argument} must be a bool, got {_type_name(value)}")
    return value


def integer(value: Any, argument: str, fn: str) -> int:
    """A true integer: ``bool`` and floats are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{fn}: {argument} must be an int, got {_type_name(value)}")
    return int(value)


def rank(value: Any, argument: str, fn: str, in_group: Group) -> int:
    """A global rank that belongs to ``in_group``; returns its group rank."""
    global_rank = integer(value, argument, fn)
    if global_rank not in in_group.ranks:
        if 0 <= global_rank < in_group._world.size:
            raise ValueError(f"{fn}: {argument}={global_rank} is not a member of group "
                             f"{in_group.name!r} (ranks {list(in_group.ranks)})")
        raise ValueError(f"{fn}: {argument}={global_rank} is out of range for a world of size "
                         f"{in_group._world.size}")
    return in_group.group_rank(global_rank)


def root(value: Any, group_value: Any, argument: str, fn: str, in_group: Group) -> int:
    """The group rank of a rooted call's root: ``group_value`` (``group_src``/``group_dst``, a
    group rank, checked against the size) when given, else the global rank ``value``."""
    if group_value is None:
        return rank(value, argument, fn, in_group)
    checked = integer(group_value, f"group_{argument}", fn)
    if not 0 <= checked < in_group.size:
        raise ValueError(f"{fn}: group_{argument}={checked} is out of range for group "
                         f"{in_group.name!r} of size {in_group.size}")
    return checked


def tag(value: Any, fn: str) -> int:
    """A user message tag in ``0 .. 2**31-1``."""
    checked = integer(value, "tag", fn)
    if not 0 <= checked < 2**31:
        raise ValueError(f"{fn}: tag must be in 0 .. 2**31-1, got {checked}")
    return checked


def array(value: Any, argument: str, fn: str, writable: bool = False) -> Staged:
    """An array argument, staged for the core."""
    return Staged(value, (fn, argument), writable)


def array_list(value: Any, argument: str, fn: str, length: int, writable: bool = False) -> list[Staged]:
    """A list (or tuple) of exactly ``length`` arrays."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{fn}: {argument} must be a list of arrays, got {_type_name(value)}")
    if len(value) != length:
        raise ArgumentMismatchError(f"{fn}: {argument} must hold {length} arrays (one per group "
                                    f"member), got {len(value)}")
    return [Staged(v, f"{fn}: {argument}[{i}]", writable) for i, v in enumerate(value)]


def same_dtype(items: Sequence[Staged], reference: Staged, argument: str, fn: str) -> None:
    """Every item has ``reference``'s dtype."""
    for i, item in enumerate(items):
        if item.array.dtype != reference.array.dtype:
            raise ArgumentMismatchError(f"{fn}: {argument}[{i}] is {item.signature} but the tensor is "
                                        f"{reference.signature}: dtypes must match")


def same_layout(items: Sequence[Staged], reference: Staged, argument: str, fn: str) -> None:
    """Every item has ``reference``'s dtype and shape."""
    same_dtype(items, reference, argument, fn)
    for i, item in enumerate(items):
        if item.array.shape != reference.array.shape:
            raise ArgumentMismatchError(f"{fn}: {argument}[{i}] is {item.signature} but the tensor is "
                                        f"{reference.signature}: shapes must match")


def split_sizes(value: Any, argument: str, fn: str, size: int, rows: int) -> list[int]:
    """Per-member row counts for ``all_to_all_single``; ``None`` means equal splits of ``rows``."""
    if value is None:
        if rows % size:
            raise ValueError(f"{fn}: dim 0 ({rows}) is not divisible by the group size ({size}); "
                             f"pass {argument}")
        return [rows // size] * size
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{fn}: {argument} must be a list of ints, got {_type_name(value)}")
    sizes = [integer(v, f"{argument}[{i}]", fn) for i, v in enumerate(value)]
    if len(sizes) != size:
        raise ValueError(f"{fn}: {argument} must have {size} entries (one per member), got {len(sizes)}")
    if any(s < 0 for s in sizes) or sum(sizes) != rows:
        raise ValueError(f"{fn}: {argument} must be non-negative and sum to dim 0 ({rows}), got {sizes}")
    return sizes


# -- memory shared between a call's arrays -------------------------------------------------------
#
# The answer for every collective (docs/semantics.md): outputs must not share memory with each
# other (ValueError, since ranks would overwrite each other's results); an input may share memory
# with an output (``all_to_all_single(x, x)``, the in-place reduce_scatter_tensor and
# all_gather_into_tensor conventions): the call then behaves as if every input had been read
# before any output was written, on every transport alike. List inputs are joined into a copy
# anyway, and list outputs are written through scratch; what remains is the tensor variants.


def _span(buf: np.ndarray) -> tuple[int, int]:
    start = buf.__array_interface__["data"][0]
    return start, start + buf.nbytes


def distinct(items: Sequence[Staged], argument: str, fn: str) -> None:
    """No two of ``items`` (outputs) share memory."""
    spans = sorted((_span(item.buf), i) for i, item in enumerate(items) if item.buf.nbytes)
    reach, holder = 0, -1
    for (start, stop), i in spans:
        if start < reach:
            first, second = sorted((holder, i))
            raise ValueError(f"{fn}: {argument}[{first}] and {argument}[{second}] share memory; "
                             "every output needs memory of its own")
        if stop > reach:
            reach, holder = stop, i


def unaliased(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``source`` (an input), or a private copy of it when it may share memory with ``target``
    (an output), so the call reads the input as it was before the output is written."""
    return source.copy() if np.may_share_memory(source, target) else source
