"""Arrays as the core wants them: numpy, C-contiguous; results copied back to the caller's object."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..adapters.registry import adapter_for
from ..algorithms.kernels import SUPPORTED_DTYPES

_SUPPORTED_NAMES = ", ".join(d.name for d in SUPPORTED_DTYPES)


class Staged:
    """One array argument: the caller's object, its numpy view and a contiguous working buffer.

    ``buf`` is the view itself when it is already C-contiguous (the usual case: zero-copy);
    otherwise a contiguous copy that ``commit`` writes back after a successful call.
    """

    def __init__(self, obj: Any, where: str, writable: bool) -> None:
        self.obj = obj
        self.adapter = adapter_for(obj, where)
        self.array: np.ndarray = self.adapter.as_numpy(obj, writable)
        if self.array.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{where}: dtype {self.array.dtype} is not supported; expected one of "
                            f"{_SUPPORTED_NAMES}")
        if writable and not self.array.flags.writeable:
            raise ValueError(f"{where}: the output array is read-only")
        self.writable = writable
        self.buf = np.ascontiguousarray(self.array)

    def commit(self) -> None:
        """Make the caller's object hold ``buf`` (after an in-place call succeeded)."""
        if self.buf is not self.array:
            self.array[...] = self.buf
        self.adapter.write_back(self.obj, self.array)

    @property
    def signature(self) -> str:
        """``dtype[shape]``, for error messages."""
        return f"{self.array.dtype}{list(self.array.shape)}"
