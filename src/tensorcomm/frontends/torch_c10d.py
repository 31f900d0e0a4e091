"""The c10d ``Backend`` object a tensorcomm process group registers for the CPU, and the torch
versions the backend was tested with.

``ProcessGroupTensorcomm`` is a Python ``ProcessGroup``; torch also reads the group's per-device
*backend object* (``pg._get_backend("cpu")``): torch 2.15 attaches a health-check hook and its
flight recorder to every new group, and both fail where that slot is empty. ``TensorcommBackend``
fills it: a real ``torch._C._distributed_c10d.Backend`` named ``"tensorcomm"`` that answers the
capability questions truthfully and hands every collective torch routes through the backend
object to the group's own method, so both paths run the same code.

torch 2.13's ``Backend`` has no Python constructor; there the slot stays empty, which is all
2.13's hooks expect.

Imports torch; only the torch backend imports this module.
"""

from __future__ import annotations

import re
import warnings
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

BACKEND_NAME = "tensorcomm"

# The torch releases the test suite ran on (tools/torch_versions.sh); pyproject asks for >= the first.
TESTED_TORCH = ("2.13.0", "2.14.1", "2.15.0")

# The c10d calls torch may route through the backend object instead of the group.
_DELEGATED = (
    "allreduce", "allreduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_single",
    "_reduce_scatter_base", "reduce_scatter_single_coalesced", "broadcast", "allgather",
    "all_gather_single", "_allgather_base", "allgather_coalesced", "all_gather_single_coalesced",
    "gather", "scatter", "all_to_all_single", "alltoall_base", "alltoall", "barrier",
    "monitored_barrier", "send", "recv", "recv_anysource",
)


def _delegate(name: str) -> Any:
    def call(self: TensorcommBackend, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._group(), name)(*args, **kwargs)

    call.__name__ = name
    call.__doc__ = f"The group's ``{name}``."
    return call


class TensorcommBackend(c10d.Backend):
    """The CPU backend object of a ``ProcessGroupTensorcomm`` (held weakly: the group owns it)."""

    def __init__(self, group: Any) -> None:
        super().__init__(group.rank(), group.size())
        self._group = weakref.ref(group)

    def getBackendName(self) -> str:  # noqa: N802 (torch's names)
        """``"tensorcomm"``."""
        return BACKEND_NAME

    def name(self) -> str:
        """``"tensorcomm"``."""
        return BACKEND_NAME

    @property
    def supports_splitting(self) -> bool:
        """Yes: ``torch.distributed.split_group`` makes tensorcomm subgroups."""
        return True

    @property
    def supports_coalescing(self) -> bool:
        """No: each call of a coalesced block runs on its own."""
        return False

    @property
    def supports_shrinking(self) -> bool:
        """No."""
        return False

    @property
    def supports_time_estimate(self) -> bool:
        """No."""
        return False

    def supports_tensor_alloc(self, device: Any) -> bool:
        """No: torch allocates tensors itself."""
        return False

    def shutdown(self) -> None:
        """The group's ``shutdown``."""
        group = self._group()
        if group is not None:
            group.shutdown()

    def abort(self) -> None:
        """The group's ``abort``."""
        group = self._group()
        if group is not None:
            group.abort()


for _name in _DELEGATED:
    setattr(TensorcommBackend, _name, _delegate(_name))


def backend_for(group: Any) -> TensorcommBackend | None:
    """The CPU backend object for ``group``, or None where torch's ``Backend`` cannot be
    subclassed in Python (torch 2.13)."""
    try:
        return TensorcommBackend(group)
    except TypeError:  # "No constructor defined"
        return None


def register_cpu_backend(group: dist.ProcessGroup) -> TensorcommBackend | None:
    """Register ``group``'s backend object for the CPU (returned; None on torch 2.13), and make
    CUSTOM the group's default backend type."""
    custom = dist.ProcessGroup.BackendType.CUSTOM
    backend = backend_for(group)
    group._register_backend(torch.device("cpu"), custom, backend)
    group._set_default_backend(custom)
    return backend


def warn_if_untested() -> None:
    """A RuntimeWarning when the running torch is newer than every tested release."""
    running = torch.__version__.split("+")[0]
    if running not in TESTED_TORCH and _release(running) > _release(TESTED_TORCH[-1]):
        warnings.warn(f"tensorcomm backend: torch {running} is untested; tensorcomm was tested "
                      f"with torch {', '.join(TESTED_TORCH)}", RuntimeWarning, stacklevel=3)


def _release(version: str) -> tuple[int, ...]:
    """``"2.15.0"`` -> ``(2, 15, 0)``; ``"2.16.0a0+git"`` -> ``(2, 16, 0)``."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    return tuple(int(n or 0) for n in match.groups()) if match else ()
