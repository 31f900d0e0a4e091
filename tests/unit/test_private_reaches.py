"""core/ reads and writes other modules' private fields in at most 30 places (issue 44): what
its modules share is named (``group.Inside``, public methods of the objects that own the
steps); the reaches that stay are listed when the count is over.

A reach is a private attribute (``x._name``) of something other than ``self``/``cls`` that no
class of the module defines, or, on one of ``self``'s fields (``self._group._name``), that no
other class of the module defines. A ``Protocol`` defines nothing: it names another module's
fields."""

from __future__ import annotations

import ast
from pathlib import Path

import tensorcomm

LIMIT = 30


def _defined(cls: ast.ClassDef) -> set[str]:
    """What a class defines: methods, class attributes, ``__slots__`` entries and the
    attributes its methods store on ``self``."""
    names: set[str] = set()
    for item in cls.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(item.name)
        elif isinstance(item, (ast.Assign, ast.AnnAssign)):
            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
            if isinstance(item.value, ast.Tuple):  # __slots__
                names.update(e.value for e in item.value.elts
                             if isinstance(e, ast.Constant) and isinstance(e.value, str))
    names.update(node.attr for node in ast.walk(cls)
                 if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                 and isinstance(node.value, ast.Name) and node.value.id == "self")
    return names


def _private(name: str) -> bool:
    """One leading underscore: not a dunder, nor an enum's sunder (``_value_``)."""
    return name.startswith("_") and not name.startswith("__") and not name.endswith("_")


def _on_self(node: ast.expr) -> bool:
    """``node`` is ``self.<field>...`` (an object ``self`` holds)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "self"


def reaches(source: str) -> list[str]:
    """``line: expression`` for each of the module's reaches (see the module docstring)."""
    tree = ast.parse(source)
    classes = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
               and not any(ast.unparse(base).endswith("Protocol") for base in node.bases)]
    defines = {cls.name: _defined(cls) for cls in classes}
    found = []

    def visit(node: ast.AST, enclosing: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            visit(child, child.name if isinstance(child, ast.ClassDef) else enclosing)
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            return
        receiver = node.value
        if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
            return
        others = [name for name in defines if not (_on_self(receiver) and name == enclosing)]
        if not any(node.attr in defines[name] for name in others):
            found.append(f"{node.lineno}: {ast.unparse(node)}")

    visit(tree, None)
    return sorted(found)


def test_core_reaches_into_other_modules_private_fields_in_at_most_30_places() -> None:
    core = Path(tensorcomm.__file__).parent / "core"
    found = [f"{path.name}:{where}" for path in sorted(core.glob("*.py"))
             for where in reaches(path.read_text())]
    assert len(found) <= LIMIT, f"{len(found)} reaches: {found}"


def test_the_count_sees_reads_writes_and_fields_of_fields_but_not_a_modules_own() -> None:
    source = ("from typing import Protocol\n"
              "class P(Protocol):\n    _declared: int\n"
              "class A:\n    __slots__ = ('_kept', '_other')\n"
              "    def _step(self):\n        self._mine = self._other._kept\n"
              "        return self._other._step, self._other._mine2\n"
              "class B:\n    def g(self):\n        self._mine2 = self._a._kept\n"
              "def f(a, b, e):\n    a._kept, a._mine = b._theirs, e._value_\n"
              "    b._written = a._step()\n    return self._x, a._declared\n")
    assert reaches(source) == ["13: b._theirs", "14: b._written", "15: a._declared",
                               "7: self._other._kept", "8: self._other._step"]
