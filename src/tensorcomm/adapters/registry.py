"""Ordered lookup of the adapter for an object; unknown kinds get a TypeError listing the known."""

from __future__ import annotations

from typing import Any

from .base import Adapter
from .numpy_ import NumpyAdapter

ADAPTERS: list[Adapter] = [NumpyAdapter()]


def adapter_for(obj: Any, argument: str) -> Adapter:
    """The first adapter that accepts ``obj``.

    Raises:
        TypeError: no adapter accepts it; the message names the argument and the known kinds.
    """
    for adapter in ADAPTERS:
        if adapter.accepts(obj):
            return adapter
    kinds = ", ".join(a.name for a in ADAPTERS)
    raise TypeError(f"{argument}: expected an array ({kinds}), got {type(obj).__module__}."
                    f"{type(obj).__qualname__}")
