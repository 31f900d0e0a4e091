"""Any object with ``__dlpack__`` whose memory is on the CPU: arrays of libraries tensorcomm has
no adapter of its own for.

``numpy.from_dlpack`` gives a zero-copy view, writable when the producer allows it. Results of
the returning style come back through the producer's array-API namespace
(``__array_namespace__().from_dlpack``) when it has one, else as numpy arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_KDL_CPU = 1  # DLPack's device type code for host memory


class DLPackAdapter:
    """Objects exposing ``__dlpack__`` and ``__dlpack_device__`` on the CPU."""

    name = "objects with __dlpack__ (CPU)"

    def accepts(self, obj: Any) -> bool:
        kind = type(obj)
        return hasattr(kind, "__dlpack__") and hasattr(kind, "__dlpack_device__")

    def as_numpy(self, obj: Any, writable: bool) -> np.ndarray:
        device_type = int(obj.__dlpack_device__()[0])
        if device_type != _KDL_CPU:
            raise TypeError(f"{type(obj).__qualname__} lives on DLPack device type {device_type}; "
                            f"tensorcomm reads host memory only (kDLCPU = {_KDL_CPU})")
        try:
            return np.from_dlpack(obj)
        except (BufferError, RuntimeError, TypeError) as exc:  # e.g. a dtype numpy lacks
            raise TypeError(f"{type(obj).__qualname__} cannot be read through DLPack: {exc}") from None

    def write_back(self, obj: Any, array: np.ndarray) -> None:
        pass  # as_numpy returned a view of obj's own memory

    def new_like(self, obj: Any, array: np.ndarray) -> Any:
        namespace = getattr(obj, "__array_namespace__", None)
        return namespace().from_dlpack(array) if namespace is not None else array
