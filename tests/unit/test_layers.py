"""The layer rules as a checked contract: which part of tensorcomm may import which.

Every import in src/tensorcomm is read from the source (``ast``; imports under
``if TYPE_CHECKING:`` are for annotations only and do not count), resolved to a module, and must
go to the importing module's own part or to a part in a lower layer. No two modules may import
each other, directly or around a longer loop, even from inside a function; in ``core`` and
``transports.tcp`` not even for annotations (a type-only import still ties the two modules: each
can only be read, and changed, with the other; a ``Protocol`` in the lower one cuts the tie).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import tensorcomm

SOURCE = Path(tensorcomm.__file__).parent

# Top to bottom; a part may import its own modules and the parts of any lower layer.
LAYERS: list[set[str]] = [
    {"__main__"},                                   # python -m tensorcomm
    {"cli"},                                        # the `tensorcomm` command
    {"bench"},                                      # measures tensorcomm beside other libraries
    {"demo", "ray"},                                # programs on the public API (ray uses torch)
    {"launch", "testing", "torch"},                 # start ranks; test harness; torch backend
    {"__init__", "ops", "cross_device", "MPI"},     # the public API (MPI: mpi4py's, over it)
    {"frontends"},                                  # validation, adapters' use, API styles
    {"core"},                                       # world, groups, engine, Work
    {"algorithms", "adapters", "trace"},            # collectives over a Team; framework arrays; records
    {"transports"},                                 # shared memory, TCP, MPI
    {"rendezvous"},                                 # stores, secrets, launcher discovery
    {"signature"},
    {"config", "errors", "types"},
]
LAYER_OF = {part: depth for depth, parts in enumerate(LAYERS) for part in parts}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in SOURCE.rglob("*.py")}


def _part(module: str) -> str:
    """``tensorcomm.core.world`` -> ``core``; the package itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(tree: ast.Module, typed: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, except those under ``if TYPE_CHECKING:`` unless ``typed``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if not typed and isinstance(node, ast.If) and ast.unparse(node.test) in (
                "TYPE_CHECKING", "typing.TYPE_CHECKING"):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _imported(module: str, typed: bool = False) -> set[str]:
    """The tensorcomm modules ``module`` imports at run time (``typed``: or for annotations)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _imports(ast.parse(path.read_text()), typed):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # `from pkg import name`: name is a submodule or an attribute of pkg.
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                     for alias in node.names]
        for name in names:
            while name and name not in MODULES:  # `import tensorcomm.x.y` where y is a name
                name = name.rpartition(".")[0]
            if name.startswith("tensorcomm") and name != module:
                found.add(name)
    return found


GRAPH = {module: _imported(module) for module in MODULES}
TYPED_GRAPH = {module: _imported(module, typed=True) for module in MODULES}
NO_TYPED_CIRCLES = ("tensorcomm.core.", "tensorcomm.transports.tcp.")  # packages held to it


def test_every_part_has_a_layer() -> None:
    assert {_part(module) for module in MODULES} <= set(LAYER_OF)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers(module: str) -> None:
    part = _part(module)
    upward = sorted(target for target in GRAPH[module]
                    if _part(target) != part and LAYER_OF[_part(target)] <= LAYER_OF[part])
    assert not upward, f"{module} ({part}) imports {upward}: same or higher layer"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A loop of imports in ``graph``, or None."""
    visiting: list[str] = []
    done: set[str] = set()

    def visit(module: str) -> list[str] | None:
        if module in visiting:
            return [*visiting[visiting.index(module):], module]
        if module in done:
            return None
        visiting.append(module)
        for target in sorted(graph[module]):
            found = visit(target)
            if found:
                return found
        visiting.pop()
        done.add(module)
        return None

    return next(filter(None, map(visit, sorted(graph))), None)


def test_no_import_cycles() -> None:
    cycle = _cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


@pytest.mark.parametrize("package", NO_TYPED_CIRCLES)
def test_no_import_cycles_counting_annotations(package: str) -> None:
    inner = {module: {t for t in targets if t.startswith(package)}
             for module, targets in TYPED_GRAPH.items() if module.startswith(package)}
    cycle = _cycle(inner)
    assert cycle is None, "import cycle (type-only imports count): " + " -> ".join(cycle or ())


def test_the_contract_sees_imports() -> None:
    # The check itself: known edges are found (relative, absolute and function-level imports).
    assert "tensorcomm.core.lifecycle" in GRAPH["tensorcomm.frontends.operators"]
    assert "tensorcomm.launch.run" in GRAPH["tensorcomm.cli"]
    assert "tensorcomm.transports.mpi.transport" in GRAPH["tensorcomm.core.world"]
    typed_only = "tensorcomm.transports.mpi.transport"  # group.py's TYPE_CHECKING import
    assert typed_only not in GRAPH["tensorcomm.core.group"]
    assert typed_only in TYPED_GRAPH["tensorcomm.core.group"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
