"""torch CPU tensors: zero-copy numpy views in both directions.

torch is never imported here: a tensor can only exist once its owner has imported torch, so the
adapter looks torch up in ``sys.modules`` and is idle until then.

The view goes through DLPack (``numpy.from_dlpack``), not ``Tensor.numpy()``: the latter marks
the tensor's storage as not resizable for good, and FSDP frees gathered parameters by resizing
their storage to zero ("Trying to resize storage that is not resizable"). A DLPack view keeps
the storage alive while it exists and leaves it resizable.

bfloat16 has no numpy dtype; such tensors travel as their raw 16-bit words, reinterpreted as
``ml_dtypes.bfloat16`` (a bit-for-bit view, still zero-copy). Non-contiguous tensors give strided
views: ``Staged`` copies them into a contiguous buffer and writes the result back through the
view. Tensors with a lazy conjugate or negative bit cannot be viewed; they are resolved into a
copy and, as outputs, written back with ``Tensor.copy_`` (which honours the bit).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..types import bfloat16, is_bfloat16


def _torch() -> Any:
    return sys.modules.get("torch")


class TorchAdapter:
    """``torch.Tensor`` on the CPU (``requires_grad`` tensors are read and written detached)."""

    name = "torch.Tensor (CPU)"

    def accepts(self, obj: Any) -> bool:
        torch = _torch()
        return torch is not None and isinstance(obj, torch.Tensor)

    def as_numpy(self, obj: Any, writable: bool) -> np.ndarray:
        torch = _torch()
        if obj.device.type != "cpu":
            raise TypeError(f"tensorcomm works on CPU tensors; got a tensor on {obj.device} "
                            f"(move it with .cpu() and copy the result back)")
        if obj.layout != torch.strided:
            raise TypeError(f"tensorcomm needs a dense (strided) tensor, got layout {obj.layout}")
        tensor = obj.detach() if obj.requires_grad else obj  # DLPack refuses autograd tensors
        if tensor.is_conj() or tensor.is_neg():
            tensor = tensor.resolve_conj().resolve_neg()
        if writable and any(s == 0 and n > 1 for s, n in zip(tensor.stride(), tensor.shape, strict=True)):
            raise ValueError("an output tensor must not be an expanded view (zero stride): its "
                             "elements share memory; pass .contiguous() and copy the result back")
        if tensor.dtype == torch.bfloat16:
            return np.from_dlpack(tensor.view(torch.int16)).view(bfloat16())
        try:
            return np.from_dlpack(tensor)
        except (BufferError, TypeError, RuntimeError) as exc:  # dtypes numpy lacks: float8, ...
            raise TypeError(f"torch dtype {obj.dtype} has no numpy equivalent tensorcomm can "
                            f"use ({exc})") from None

    def write_back(self, obj: Any, array: np.ndarray) -> None:
        torch = _torch()
        # as_numpy returned a view of obj's memory unless a lazy bit forced a copy.
        if obj.is_conj() or obj.is_neg():
            with torch.no_grad():
                obj.copy_(self.new_like(obj, array))
        else:
            # Writes through numpy bypass autograd's version counter; bump it so a tensor saved
            # for backward and then overwritten by a collective is reported, as with torch's ops.
            torch.autograd.graph.increment_version(obj)

    def new_like(self, obj: Any, array: np.ndarray) -> Any:
        torch = _torch()
        if not array.flags.writeable:  # from_numpy warns on read-only arrays: own a copy
            array = array.copy()
        if is_bfloat16(array.dtype):
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(array)
