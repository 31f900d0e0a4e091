"""numpy arrays: used as they are."""

from __future__ import annotations

from typing import Any

import numpy as np


class NumpyAdapter:
    """``numpy.ndarray`` (and subclasses): zero-copy in both directions."""

    name = "numpy.ndarray"

    def accepts(self, obj: Any) -> bool:
        return isinstance(obj, np.ndarray)

    def as_numpy(self, obj: np.ndarray, writable: bool) -> np.ndarray:
        return obj

    def write_back(self, obj: np.ndarray, array: np.ndarray) -> None:
        if array is not obj:
            obj[...] = array

    def new_like(self, obj: np.ndarray, array: np.ndarray) -> np.ndarray:
        return array
