"""Objects known by a protocol only: the buffer protocol (bytearray, array.array, memoryview,
mmap, ctypes arrays) or numpy's ``__array_interface__`` / ``__array_struct__``.

Both give zero-copy numpy views; read-only buffers (bytes) and numpy scalars (``np.float32(3)``:
immutable, numpy hands out a copy) can be inputs only. Results of the
returning style come back as numpy arrays: such objects have no way to build one of their kind.
Lists and scalars are deliberately not arrays here: a list is an argument list of arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _has_interface(obj: Any) -> bool:
    return hasattr(obj, "__array_interface__") or hasattr(obj, "__array_struct__")


def has_buffer(obj: Any) -> bool:
    """Whether ``obj`` exposes the buffer protocol."""
    try:
        memoryview(obj)
    except TypeError:
        return False
    return True


class BufferAdapter:
    """Buffer-protocol and ``__array_interface__`` objects."""

    name = "objects with the buffer protocol or __array_interface__"

    def accepts(self, obj: Any) -> bool:
        return _has_interface(obj) or has_buffer(obj)

    def as_numpy(self, obj: Any, writable: bool) -> np.ndarray:
        source = obj if _has_interface(obj) else memoryview(obj)
        try:
            array = np.asarray(source)
        except (TypeError, ValueError) as exc:  # e.g. a buffer format numpy cannot read
            raise TypeError(f"{type(obj).__qualname__} cannot be read as an array: {exc}") from None
        if isinstance(obj, np.generic):  # a copy: results written into it would be lost
            array.flags.writeable = False
        return array

    def write_back(self, obj: Any, array: np.ndarray) -> None:
        pass  # as_numpy returned a view of obj's own memory

    def new_like(self, obj: Any, array: np.ndarray) -> Any:
        return array
