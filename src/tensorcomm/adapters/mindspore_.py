"""MindSpore tensors (CPU build): read through ``asnumpy``, written back with ``copy_``.

``Tensor.asnumpy()`` shares memory with a contiguous tensor on the host, so results written
into that view are already in place; for anything else (views MindSpore copies, bfloat16) the
result is written back with ``Tensor.copy_``. MindSpore's own numpy bfloat16 only works with the
numpy it was compiled against, so bfloat16 tensors cross as float32 (exact: every bfloat16 is a
float32) and become ``ml_dtypes.bfloat16`` here.

mindspore is never imported here: the adapter looks it up in ``sys.modules``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..types import bfloat16, is_bfloat16


def _mindspore() -> Any:
    return sys.modules.get("mindspore")


class MindSporeAdapter:
    """``mindspore.Tensor`` (and ``Parameter``) on the host."""

    name = "mindspore.Tensor"

    def accepts(self, obj: Any) -> bool:
        ms = _mindspore()
        return ms is not None and isinstance(obj, ms.Tensor)

    def as_numpy(self, obj: Any, writable: bool) -> np.ndarray:
        ms = _mindspore()
        if obj.dtype == ms.bfloat16:
            return obj.astype(ms.float32).asnumpy().astype(bfloat16())
        return obj.asnumpy()

    def write_back(self, obj: Any, array: np.ndarray) -> None:
        if array.ctypes.data != obj.data_ptr():  # not a view of obj: copy the result in
            obj.copy_(self.new_like(obj, array))

    def new_like(self, obj: Any, array: np.ndarray) -> Any:
        ms = _mindspore()
        if is_bfloat16(array.dtype):
            return ms.Tensor(array.astype(np.float32)).astype(ms.bfloat16)
        return ms.Tensor(np.ascontiguousarray(array))
