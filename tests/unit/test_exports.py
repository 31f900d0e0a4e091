"""The public surface is exactly what ``__all__`` says, documented, and imports no framework."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

import tensorcomm
import tensorcomm.cross_device
import tensorcomm.errors
import tensorcomm.ops
import tensorcomm.testing

PUBLIC = {
    "init", "init_process_group", "destroy", "destroy_process_group", "is_initialized",
    "get_rank", "get_world_size", "get_local_rank", "new_group", "create_group",
    "new_subgroups_by_enumeration", "get_group_rank", "get_global_rank", "Group", "CallInfo",
    "WORLD",
    "empty", "zeros",
    "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "gather",
    "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
    "barrier", "scan", "exscan", "send", "recv", "isend", "irecv",
    "all_reduce_init", "reduce_init", "broadcast_init", "all_gather_init", "all_gather_into_tensor_init",
    "gather_init", "scatter_init", "reduce_scatter_init", "reduce_scatter_tensor_init", "all_to_all_init",
    "all_to_all_single_init", "barrier_init", "scan_init", "exscan_init", "Prequest",
    "all_to_all_v", "all_gather_v", "gather_v", "scatter_v", "reduce_scatter_v", "sparse_all_reduce",
    "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
    "send_object", "recv_object", "isend_object", "irecv_object",
    "ReduceOp", "PremulSum", "premul_sum", "TransportKind", "Work",
    "CommError", "CommTimeoutError", "PeerLostError", "CollectiveMismatchError",
    "GroupAbortedError", "ExcludedError", "ConcurrentUseError", "RendezvousError",
    "AuthenticationError", "LinkAuthenticationError", "ArgumentMismatchError",
}


def test_exports_are_pinned():
    assert set(tensorcomm.__all__) == PUBLIC
    for name in tensorcomm.__all__:
        assert hasattr(tensorcomm, name), name


def test_errors_exports_every_exception_it_defines():
    defined = {name for name, obj in vars(tensorcomm.errors).items()
               if inspect.isclass(obj) and issubclass(obj, BaseException)
               and obj.__module__ == "tensorcomm.errors"}
    assert set(tensorcomm.errors.__all__) == defined


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


# -- what the API reference shows: every public name, and nothing a user sees that it does not --

API_PAGES = Path(__file__).resolve().parents[2] / "docs" / "api"
PUBLIC_MODULES = ("tensorcomm", "tensorcomm.ops", "tensorcomm.cross_device", "tensorcomm.errors",
                  "tensorcomm.testing", "tensorcomm.torch", "tensorcomm.ray")
OPTIONAL = {"tensorcomm.torch": "torch", "tensorcomm.ray": "ray"}  # extras a test venv may lack


PAGES = {page.name: page.read_text() for page in sorted(API_PAGES.glob("*.md"))}


def _directives() -> dict[str, tuple[str, list[str] | None]]:
    """Every ``::: path`` of docs/api/*.md -> (its page, its ``members:`` list or None)."""
    found: dict[str, tuple[str, list[str] | None]] = {}
    for page, text in PAGES.items():
        for match in re.finditer(r"^::: (\S+)\n((?:[ \t]+\S.*\n?)*)", text, re.M):
            members = re.search(r"members:\s*\[([^\]]*)\]", match.group(2))
            found[match.group(1)] = (page, None if members is None else
                                     [m.strip() for m in members.group(1).split(",") if m.strip()])
    return found


DIRECTIVES = _directives()


def _names_of(module: str) -> set[str]:
    """The ``:::`` paths that name ``module`` or one of its attributes."""
    return {path for path in DIRECTIVES if path == module
            or (path.rpartition(".")[0] == module and path not in PUBLIC_MODULES)}


def _module(name: str) -> ModuleType:
    if name in OPTIONAL:
        pytest.importorskip(OPTIONAL[name])
    return importlib.import_module(name)


def _own_classes(cls: type) -> list[type]:
    return [k for k in cls.__mro__ if k.__module__.startswith("tensorcomm")]


def _public_attributes(cls: type) -> set[str]:
    """The non-underscore names a user sees on ``cls`` or its instances that tensorcomm defines:
    its classes' attributes and annotations, and what their methods assign to ``self``. Names a
    base class from elsewhere defines (torch's ``Backend``, ``Exception``, ``Enum``) are that
    base's API."""
    names: set[str] = set()
    for klass in _own_classes(cls):
        names |= set(vars(klass)) | set(vars(klass).get("__annotations__", {}))
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                  and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name)
                  and node.value.id == "self"}
    foreign = [k for k in cls.__mro__ if not k.__module__.startswith("tensorcomm")]
    return {n for n in names if not n.startswith("_") and not any(hasattr(k, n) for k in foreign)}


def _documented_members(cls: type, members: list[str] | None) -> set[str]:
    """What the reference shows of ``cls``: the names its docstrings spell as ``name`` or list
    in a section (attributes, fields, enum members, arguments kept as attributes), and the
    members of an explicit ``members:`` list, else (mkdocstrings' default with
    ``show_if_no_docstring: false``) the members with a docstring of their own."""
    shown = set(members or ())
    for klass in _own_classes(cls):
        doc = klass.__doc__ or ""
        shown |= set(re.findall(r"``(\w+)``", doc)) | set(re.findall(r"^\s*(\w+)(?: \(.*\))?:", doc, re.M))
        if members is not None:
            continue
        for name, member in vars(klass).items():
            raw = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
            if callable(raw) and (getattr(raw, "__doc__", None) or "").strip():
                shown.add(name)
    return shown


def _documentation(module: str, name: str) -> tuple[str, list[str] | None] | None:
    """Where ``module.name`` is documented: its own ``:::`` or its module's, else None."""
    return DIRECTIVES.get(f"{module}.{name}") or DIRECTIVES.get(module)


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_all_matches_the_api_reference(module_name):
    module = _module(module_name)
    assert hasattr(module, "__all__"), f"{module_name} has no __all__"
    shown = _names_of(module_name)
    assert shown, f"docs/api/ has no page for {module_name}"
    pages = {DIRECTIVES[path][0] for path in shown}
    undocumented = []
    for name in module.__all__:
        # or the module's page gives it in its prose, as another spelling of a documented name
        if _documentation(module_name, name) is None and not any(
                f"`{name}`" in PAGES[page] or f"`{module_name}.{name}" in PAGES[page] for page in pages):
            undocumented.append(name)
    assert not undocumented, f"{module_name}.__all__ names that docs/api/ does not show: {undocumented}"
    stray = [path for path in shown if path != module_name and path.rpartition(".")[2] not in module.__all__]
    assert not stray, f"docs/api/ shows names outside {module_name}.__all__: {stray}"


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_public_attribute_of_an_exported_class_is_documented(module_name):
    module = _module(module_name)
    undocumented = []
    for name in module.__all__:
        cls = getattr(module, name)
        if not inspect.isclass(cls) or not cls.__module__.startswith("tensorcomm"):
            continue
        where = _documentation(module_name, name)
        assert where is not None, f"{module_name}.{name} is not in docs/api/"
        shown = _documented_members(cls, where[1])
        undocumented += [f"{module_name}.{name}.{attr}" for attr in sorted(_public_attributes(cls) - shown)]
    assert not undocumented, ("attributes a user sees that the API reference does not document "
                              f"(document them, or give internals an underscore name): {undocumented}")
