"""No function in src/tensorcomm is longer than 80 lines (decorators included): a longer one is
split into steps with names."""

from __future__ import annotations

import ast
from pathlib import Path

import tensorcomm

LIMIT = 80


def _lengths(source: str) -> dict[str, int]:
    """Each function's name (``line:name``) and its length in lines, decorators included."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            found[f"{node.lineno}:{node.name}"] = (node.end_lineno or node.lineno) - first + 1
    return found


def test_no_function_is_over_80_lines() -> None:
    source = Path(tensorcomm.__file__).parent
    long = {f"{path.relative_to(source)}:{where}": n for path in sorted(source.rglob("*.py"))
            for where, n in _lengths(path.read_text()).items() if n > LIMIT}
    assert not long, f"functions over {LIMIT} lines: {long}"


def test_the_count_includes_decorators_and_nested_functions() -> None:
    body = "\n".join(f"    x = {i}" for i in range(LIMIT - 3))
    source = f"@dec\ndef f():\n    def g():\n        pass\n{body}\n"
    assert _lengths(source) == {"2:f": LIMIT + 1, "3:g": 2}
