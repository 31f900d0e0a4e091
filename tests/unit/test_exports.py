"""The public surface is exactly what ``__all__`` says, documented, and imports no framework."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import tensorcomm
import tensorcomm.cross_device
import tensorcomm.ops
import tensorcomm.testing

PUBLIC = {
    "init", "init_process_group", "destroy", "destroy_process_group", "is_initialized",
    "get_rank", "get_world_size", "get_local_rank", "new_group", "create_group",
    "get_group_rank", "get_global_rank", "Group", "WORLD",
    "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "gather",
    "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
    "barrier", "send", "recv", "isend", "irecv",
    "all_to_all_v", "all_gather_v", "gather_v", "scatter_v",
    "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
    "ReduceOp", "PremulSum", "premul_sum", "TransportKind", "Work",
    "CommError", "CommTimeoutError", "PeerLostError", "CollectiveMismatchError",
    "GroupAbortedError", "ExcludedError", "RendezvousError", "AuthenticationError",
    "LinkAuthenticationError", "ArgumentMismatchError",
}


def test_exports_are_pinned():
    assert set(tensorcomm.__all__) == PUBLIC
    for name in tensorcomm.__all__:
        assert hasattr(tensorcomm, name), name


def _public_callables(module):
    for name in getattr(module, "__all__", [n for n in dir(module) if not n.startswith("_")]):
        obj = getattr(module, name)
        if callable(obj) and getattr(obj, "__module__", "").startswith("tensorcomm"):
            yield f"{module.__name__}.{name}", obj
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if not attr.startswith("_") and callable(member):
                        yield f"{module.__name__}.{name}.{attr}", member


def test_every_public_callable_has_a_docstring():
    missing = [name for module in (tensorcomm, tensorcomm.ops, tensorcomm.cross_device, tensorcomm.testing)
               for name, obj in _public_callables(module) if not (inspect.getdoc(obj) or "").strip()]
    assert not missing, f"public callables without a docstring: {missing}"


@pytest.mark.spawns
def test_import_loads_no_framework_and_prints_nothing():
    code = ("import sys, tensorcomm, tensorcomm.ops, tensorcomm.cross_device; "
            "print(sorted(m for m in ('torch', 'jax', 'mindspore', 'tensorflow') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert done.stderr == ""
