"""Ordered lookup of the adapter for an object; unknown kinds get a TypeError listing the known.

Order matters: exact kinds first (numpy, then the frameworks), then the protocols a framework's
tensors also speak (``__dlpack__``, the buffer protocol), so a torch tensor is handled as a torch
tensor (zero-copy, written in place) rather than as a generic DLPack producer. No framework is
imported to decide: each framework adapter looks its framework up in ``sys.modules``, since an
object of a framework that was never imported cannot exist.
"""

from __future__ import annotations

from typing import Any

from .base import Adapter
from .buffer import BufferAdapter
from .dlpack import DLPackAdapter
from .jax_ import JaxAdapter
from .mindspore_ import MindSporeAdapter
from .numpy_ import NumpyAdapter
from .torch_ import TorchAdapter

ADAPTERS: list[Adapter] = [NumpyAdapter(), TorchAdapter(), JaxAdapter(), MindSporeAdapter(),
                           DLPackAdapter(), BufferAdapter()]


def adapter_for(obj: Any, argument: str | tuple[str, str]) -> Adapter:
    """The first adapter that accepts ``obj``; ``argument`` names it in the error, as
    ``"fn: argument"`` or ``(fn, argument)`` (formatted only when there is an error).

    Raises:
        TypeError: no adapter accepts it; the message names the argument and the known kinds.
    """
    for adapter in ADAPTERS:
        if adapter.accepts(obj):
            return adapter
    kinds = ", ".join(a.name for a in ADAPTERS)
    if not isinstance(argument, str):
        argument = f"{argument[0]}: {argument[1]}"
    raise TypeError(f"{argument}: expected an array ({kinds}), got {type(obj).__module__}."
                    f"{type(obj).__qualname__}")
