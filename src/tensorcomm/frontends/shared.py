"""Shared arrays, numpy style: ``empty`` and ``zeros`` in a group's shared memory (``core/shared.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core import shared
from . import validate

__all__ = ["empty", "zeros"]


def _shape(shape: Any, fn: str) -> tuple[int, ...]:
    if isinstance(shape, Sequence) and not isinstance(shape, (str, bytes)):
        dims = tuple(validate.integer(n, f"shape[{i}]", fn) for i, n in enumerate(shape))
    else:
        dims = (validate.integer(shape, "shape", fn),)
    if any(n < 0 for n in dims):
        raise ValueError(f"{fn}: shape must not be negative, got {dims}")
    return dims


def _dtype(dtype: Any, fn: str) -> np.dtype:
    try:
        kind = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{fn}: dtype must be a numpy dtype, got {dtype!r}") from None
    if kind.hasobject:
        raise ValueError(f"{fn}: dtype {kind} holds Python objects, which cannot live in shared memory")
    return kind


def zeros(shape: int | Sequence[int], dtype: Any = float, group: Any = None) -> np.ndarray:
    """A zero-filled numpy array in the host's shared memory, which the other members of ``group``
    read in place: a collective of the group's members, who all pass the same shape and dtype.

    Collectives on such arrays copy each byte once, straight from the array that holds it (a
    broadcast's receivers read the root's array itself, an all-gather reads each peer's), where
    plain arrays go through the shared slots or the kernel (docs/transports.md says when each
    pays). The group keeps the memory until it is destroyed (``destroy()`` too); an array still
    held after that stays valid, but is an ordinary array from then on. A group whose members do
    not share a host (or that runs over TCP) gets a plain ``numpy.zeros`` array.

    Args:
        shape: an int or a sequence of ints, as numpy's.
        dtype: anything ``numpy.dtype`` accepts, except object dtypes (default float64).
        group: the group whose members share the array (default: the world).

    Returns:
        This member's array (C-contiguous).

    Raises:
        TypeError: ``shape`` is not made of ints, or ``dtype`` is not a dtype.
        ValueError: a negative dimension, an object dtype, or this process is not a member.
        CollectiveMismatchError: members asked for different shapes or dtypes (on every member).
    """
    fn = "zeros"
    dims, kind = _shape(shape, fn), _dtype(dtype, fn)
    return shared.allocate(validate.group(group, fn), dims, kind)


def empty(shape: int | Sequence[int], dtype: Any = float, group: Any = None) -> np.ndarray:
    """A numpy array in the host's shared memory, as ``zeros`` makes, whose contents are not to be
    relied on (as ``numpy.empty``'s). Arguments, result and errors as ``zeros``."""
    fn = "empty"
    dims, kind = _shape(shape, fn), _dtype(dtype, fn)
    return shared.allocate(validate.group(group, fn), dims, kind)
