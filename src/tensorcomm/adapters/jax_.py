"""JAX arrays: read as numpy, never written, results returned as new ``jax.Array``s.

JAX arrays are immutable, so they can be inputs of any collective but not the outputs of the
in-place (torch-style) functions; those get a TypeError that points to the returning style
(``tensorcomm.ops``), whose results come back as ``jax.Array``s through ``new_like``. Traced
values inside ``jax.jit`` have no data yet and are refused with their own message.

jax is never imported here: the adapter looks it up in ``sys.modules`` (an array exists only once
its owner imported jax).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

_IMMUTABLE = ("JAX arrays are immutable and cannot be written in place; use the returning style, "
              "e.g. y = tensorcomm.ops.AllReduce()(x), which returns a new jax.Array")


def _jax() -> Any:
    return sys.modules.get("jax")


class JaxAdapter:
    """``jax.Array``: an input anywhere, never an in-place output."""

    name = "jax.Array (input only)"

    def accepts(self, obj: Any) -> bool:
        jax = _jax()
        return jax is not None and isinstance(obj, jax.Array)

    def as_numpy(self, obj: Any, writable: bool) -> np.ndarray:
        if writable:
            raise TypeError(_IMMUTABLE)
        if isinstance(obj, _jax().core.Tracer):
            raise TypeError("a traced JAX value (inside jax.jit, grad or vmap) has no data to send; "
                            "call tensorcomm outside the traced function")
        # Zero-copy for arrays on the CPU; a device-to-host copy otherwise.
        return np.asarray(obj)

    def write_back(self, obj: Any, array: np.ndarray) -> None:
        raise TypeError(_IMMUTABLE)

    def new_like(self, obj: Any, array: np.ndarray) -> Any:
        jax = _jax()
        devices = obj.devices()
        # Keep a single-device input's placement; anything sharded lands on the default device.
        return jax.device_put(array, next(iter(devices)) if len(devices) == 1 else None)
