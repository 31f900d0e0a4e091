"""The test tree shadows no package: pytest puts ``tests/`` and each test folder on ``sys.path``, so
a folder named like an optional dependency (``tests/ray/``) would be imported in its place as a
namespace package, and ``pytest.importorskip`` would not skip when the dependency is missing."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Import names that differ from the distribution's name, or come with one (mpi4py's MPI).
EXTRA_IMPORT_NAMES = {"MPI", "material", "yaml", "jaxlib", "cryptography", "pandas"}


def dependency_import_names() -> set[str]:
    text = (ROOT / "pyproject.toml").read_text()
    section = text[text.index("\ndependencies = ["):text.index("\n[project.scripts]")]
    specs = re.findall(r'"([A-Za-z0-9_.-]+)', "\n".join(line.split("#")[0] for line in section.splitlines()))
    return {spec.replace("-", "_").lower() for spec in specs} | EXTRA_IMPORT_NAMES


def test_no_test_folder_is_named_like_a_dependency() -> None:
    folders = {p.name for p in (ROOT / "tests").rglob("*") if p.is_dir() and p.name != "__pycache__"}
    assert folders & dependency_import_names() == set()


def test_no_test_module_imports_another() -> None:
    """Shared test code lives in tests/helpers.py (or a folder's non-test module), never in a test
    module another one imports: that would run the imported module's tests twice, or hide them."""
    imports = []
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            imports += [(path.name, name) for name in names if name.split(".")[0].startswith("test_")]
    assert imports == []
