"""Arrays as the core wants them: numpy, C-contiguous; results copied back to the caller's object."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..adapters.base import Adapter
from ..adapters.registry import adapter_for
from ..types import SUPPORTED, SUPPORTED_DTYPES

_SUPPORTED = SUPPORTED  # a set: ``in`` without Python frames (bfloat16 joins it when first seen)
_SUPPORTED_NAMES = ", ".join(SUPPORTED_DTYPES.names())
_ndarray = np.ndarray
_numpy_adapter: Adapter | None = None  # the registry's adapter for plain ndarrays, found once


def _text(where: str | tuple[str, str]) -> str:
    return where if isinstance(where, str) else f"{where[0]}: {where[1]}"


class Staged:
    """One array argument: the caller's object, its numpy view and a contiguous working buffer.

    ``buf`` is the view itself when it is already C-contiguous (the usual case: zero-copy);
    otherwise a contiguous copy that ``commit`` writes back after a successful call.
    ``needs_commit`` is False when ``commit`` has nothing to do (a contiguous numpy array).

    This runs on every call, so the common case (a plain, contiguous numpy array) avoids the
    registry walk and copies, but goes through the same checks.
    """

    __slots__ = ("obj", "adapter", "array", "writable", "buf", "needs_commit")

    def __init__(self, obj: Any, where: str | tuple[str, str], writable: bool) -> None:
        """Stage ``obj``; ``where`` names it in errors: ``"fn: argument"``, or ``(fn, argument)``
        (formatted only if there is an error to report).

        Raises:
            TypeError: ``obj`` is not an array tensorcomm knows, or its dtype is not supported.
            ValueError: ``writable`` is asked of a read-only array.
        """
        global _numpy_adapter
        self.obj = obj
        if type(obj) is _ndarray and _numpy_adapter is not None:
            adapter = _numpy_adapter
            array = obj  # what the numpy adapter's as_numpy returns for a plain ndarray
        else:
            adapter = adapter_for(obj, where)
            array = adapter.as_numpy(obj, writable)
            if type(obj) is _ndarray:
                _numpy_adapter = adapter
        self.adapter = adapter
        self.array: np.ndarray = array
        if array.dtype not in _SUPPORTED and array.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{_text(where)}: dtype {array.dtype} is not supported; expected one of "
                            f"{_SUPPORTED_NAMES}")
        flags = array.flags
        if writable and not flags.writeable:
            raise ValueError(f"{_text(where)}: the output array is read-only (as are arrays that Ray "
                             f"passes to actors from its object store, views of bytes and numpy "
                             f"scalars); pass a writable copy, e.g. arr.copy()")
        self.writable = writable
        if flags.c_contiguous and array.ndim:
            self.buf = array
            self.needs_commit = adapter is not _numpy_adapter or array is not obj
        else:
            self.buf = np.ascontiguousarray(array)
            self.needs_commit = True

    def commit(self) -> None:
        """Make the caller's object hold ``buf`` (after an in-place call succeeded)."""
        if self.buf is not self.array:
            self.array[...] = self.buf
        self.adapter.write_back(self.obj, self.array)

    @property
    def signature(self) -> str:
        """``dtype[shape]``, for error messages."""
        return f"{self.array.dtype}{list(self.array.shape)}"
