"""The test tree shadows no package: pytest puts ``tests/`` and each test folder on ``sys.path``, so
a folder named like an optional dependency (``tests/ray/``) would be imported in its place as a
namespace package, and ``pytest.importorskip`` would not skip when the dependency is missing."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Import names that differ from the distribution's name, or come with one (mpi4py's MPI).
EXTRA_IMPORT_NAMES = {"mpi4py", "MPI", "material", "yaml", "mkdocs", "jax", "jaxlib", "ray", "torch"}


def dependency_import_names() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        specs += extra
    names = {re.split(r"[\s\[<>=!~;]", spec, maxsplit=1)[0].replace("-", "_").lower() for spec in specs}
    return names | EXTRA_IMPORT_NAMES


def test_no_test_folder_is_named_like_a_dependency() -> None:
    folders = {p.name for p in (ROOT / "tests").rglob("*") if p.is_dir() and p.name != "__pycache__"}
    assert folders & dependency_import_names() == set()
