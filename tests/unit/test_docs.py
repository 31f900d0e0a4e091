"""The documentation site covers what it should: every page is in the nav, every public name of
``tensorcomm`` is on the API page, and every public module has an API page. Every code block of
README.md and docs/ runs as written, or says it is a fragment.

Each block is preceded by an HTML comment (invisible on GitHub and on the site) that says which:
``<!-- run: tensorcomm run -n 2 -->`` (also ``python`` or ``mpiexec -n 2 python``, then
``; needs ray torch`` for what it imports beyond numpy) or ``<!-- fragment: why -->``. The
``run`` blocks are executed under that command (tests marked ``spawns``: the full suite).

The site itself is built with ``mkdocs build --strict`` (the ``docs`` extra); these checks need
no MkDocs.
"""

from __future__ import annotations

import ast
import inspect
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

import tensorcomm

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MARKDOWN = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
PUBLIC_MODULES = ["tensorcomm", "tensorcomm.ops", "tensorcomm.cross_device", "tensorcomm.errors",
                  "tensorcomm.testing", "tensorcomm.torch", "tensorcomm.ray"]


def nav_pages() -> set[str]:
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:"):]
    return set(re.findall(r":\s*(\S+\.md)\s*$", nav, flags=re.MULTILINE))


def test_every_page_is_in_the_nav() -> None:
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    nav = nav_pages()
    assert pages - nav == set(), "pages missing from mkdocs.yml's nav"
    assert nav - pages == set(), "nav entries without a page"


# An internal issue number ("issue 21", "(issue 14)"), a commit hash: history, which goes to
# CHANGELOG.md (docs/changelog.md only includes it). Issues of other projects name the project.
_HISTORY = re.compile(r"(?<!CPython )\bissues? \d+|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")


def test_user_docs_carry_no_history() -> None:
    found = [(page.name, hit.group()) for page in MARKDOWN if page.name != "changelog.md"
             for hit in _HISTORY.finditer(page.read_text())]
    assert found == []


_TEST_REFERENCE = re.compile(r"(tests/\w+/test_\w+\.py)(?:::(\w+))?")


def test_the_tests_the_docs_name_exist() -> None:
    """A test file (``tests/unit/test_x.py``) or test (``...py::test_y``) a page names as evidence
    exists: moving or renaming a test updates the docs that cite it."""
    missing = []
    for page in MARKDOWN:
        for path, name in _TEST_REFERENCE.findall(page.read_text()):
            source = ROOT / path
            if not source.exists() or (name and not re.search(rf"^(?:async )?def {name}\b",
                                                                  source.read_text(), flags=re.MULTILINE)):
                missing.append((page.name, f"{path}::{name}" if name else path))
    assert missing == []


def test_the_contributor_install_line_installs_what_ci_does() -> None:
    """docs/contributing.md's install line names the extras .ci/run installs (mpi apart: it
    needs MPICH, and has a line of its own)."""
    ci = set(re.search(r'^extras="([^"]+)"', (ROOT / ".ci" / "run").read_text(), flags=re.MULTILINE)
             .group(1).split(","))
    guide = (DOCS / "contributing.md").read_text()
    assert {frozenset(m.split(",")) for m in re.findall(r'pip install -e "\.\[([^\]]+)\]"', guide)
            } >= {frozenset(ci)}


def test_nav_titles_are_the_page_titles() -> None:
    """A nav entry's title is its page's heading, up to a colon (Home excepted)."""
    text = (ROOT / "mkdocs.yml").read_text()
    entries = re.findall(r"^\s*- (.+?): (\S+\.md)\s*$", text[text.index("\nnav:"):], flags=re.MULTILINE)
    differ = []
    for title, page in entries:
        heading = re.search(r"^# (.+)$", (DOCS / page).read_text(), flags=re.MULTILINE)
        assert heading, page
        if page != "index.md" and heading.group(1).replace("`", "").split(": ")[0] != title:
            differ.append((title, heading.group(1)))
    assert differ == []


def test_the_site_shows_the_package_version() -> None:
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), flags=re.MULTILINE)
    assert version and version.group(1) == tensorcomm.__version__
    assert f"copyright: tensorcomm {tensorcomm.__version__}" in (ROOT / "mkdocs.yml").read_text()


def test_algorithm_names_in_the_docs_are_rows_of_the_selection_table() -> None:
    from tensorcomm.algorithms import select

    text = "".join(path.read_text() for path in MARKDOWN)
    named = [tuple(pair.split("=")) for forced in re.findall(r"TENSORCOMM_ALGORITHMS=([\w=,]+)", text)
             for pair in forced.split(",")]
    named += re.findall(r"\b(\w+)\(\w+\[[\d, ]*\], op=\w+\): (\w+)", text)  # tensorcomm.plan's lines
    assert len(named) >= 5
    assert [(c, name) for c, name in named if name not in select.names(c)] == []


PLAN_LINE = re.compile(r"`(all_reduce on group 'world', all_reduce\((\w+)\[(\d+)\], op=(\w+)\): \w+)`")


@pytest.mark.spawns
def test_the_documented_plan_lines_are_what_two_ranks_log(tmp_path: Path) -> None:
    """The ``tensorcomm.plan`` lines quoted in the docs are what a 2-rank job on this host logs."""
    lines = PLAN_LINE.findall("".join(path.read_text() for path in MARKDOWN))
    assert lines
    calls = "\n".join(f"tc.all_reduce(np.ones({count}, np.{dtype}), op={op!r})"
                      for _, dtype, count, op in lines)
    script = tmp_path / "plan.py"
    script.write_text("import logging, numpy as np, tensorcomm as tc\nlogging.basicConfig()\n"
                      "logging.getLogger('tensorcomm.plan').setLevel(logging.DEBUG)\n"
                      f"tc.init()\n{calls}\ntc.destroy()\n")
    done = subprocess.run([sys.executable, "-m", "tensorcomm", "run", "-n", "2", "--timeout", "50",
                           str(script)], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-4000:]
    assert [line for line, *_ in lines if line not in done.stdout + done.stderr] == []


def test_every_public_name_is_on_the_api_page() -> None:
    page = (DOCS / "api" / "tensorcomm.md").read_text()
    missing = [name for name in tensorcomm.__all__
               if f"::: tensorcomm.{name}\n" not in page and f"`{name}`" not in page
               and f"`tensorcomm.{name}" not in page]
    assert missing == []


def test_the_api_reference_shows_no_private_base() -> None:
    """A class's bases are listed on its API page unless the page sets ``show_bases: false``."""
    import importlib

    shown = []
    for page in (DOCS / "api").glob("*.md"):
        text = page.read_text()
        if "show_bases: false" not in text:
            shown += re.findall(r"^::: ([\w.]+)$", text, flags=re.MULTILINE)
    private = []
    for name in shown:
        module, _, attribute = name.rpartition(".")
        try:
            target = importlib.import_module(name)
        except ImportError:
            target = getattr(importlib.import_module(module), attribute, None) if module else None
        if target is None:
            continue  # an optional dependency (Ray) is missing
        members = [getattr(target, n) for n in getattr(target, "__all__", [])] or [target]
        for cls in members:
            if isinstance(cls, type):  # the bases as the source spells them, which the site shows
                tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
                bases = [ast.unparse(b) for b in tree.body[0].bases]
                private += [f"{cls.__qualname__}({b})" for b in bases if b.split(".")[-1].startswith("_")]
    assert private == []


def test_every_public_module_has_an_api_page() -> None:
    text = "".join(p.read_text() for p in (DOCS / "api").glob("*.md"))
    assert [m for m in PUBLIC_MODULES if f"::: {m}" not in text] == []


@dataclass(frozen=True)
class Block:
    """One fenced code block and the comment above it."""

    where: str  # "docs/ray.md:10"
    language: str
    marker: str  # "run" or "fragment", "" when there is none
    spec: str  # after "run:": the command, then "; needs" and modules
    code: str


_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(r"^<!-- (run|fragment)(?::\s*(.*?))? -->$")


def blocks() -> list[Block]:
    found = []
    for path in MARKDOWN:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            fence = _FENCE.match(lines[i])
            if not fence:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            marker = _MARKER.match(lines[i - 1]) if i else None
            found.append(Block(f"{path.relative_to(ROOT)}:{i + 1}", fence.group(1),
                               marker.group(1) if marker else "", (marker and marker.group(2)) or "",
                               "\n".join(lines[i + 1:end]) + "\n"))
            i = end + 1
    return found


def command(block: Block, script: Path) -> list[str]:
    """The argv that runs ``script`` as ``block``'s marker says."""
    launcher = block.spec.split(";")[0].split()
    if launcher[:2] == ["tensorcomm", "run"]:
        return [sys.executable, "-m", "tensorcomm", "run", *launcher[2:], "--timeout", "150", str(script)]
    if launcher[:1] == ["mpiexec"] and launcher[-1:] == ["python"]:
        return [*launcher[:-1], sys.executable, str(script)]
    if launcher == ["python"]:
        return [sys.executable, str(script)]
    raise ValueError(f"{block.where}: unknown command {block.spec!r}")


def needs(block: Block) -> list[str]:
    _, _, rest = block.spec.partition(";")
    words = rest.split()
    return words[1:] if words[:1] == ["needs"] else []


RUNNABLE = [b for b in blocks() if b.marker == "run"]


def test_every_code_block_runs_or_says_it_is_a_fragment() -> None:
    unmarked = [b.where for b in blocks() if not b.marker]
    assert unmarked == [], "precede each block with <!-- run: COMMAND --> or <!-- fragment: why -->"


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.where)
def test_runnable_blocks_are_python_with_a_known_command(block: Block, tmp_path: Path) -> None:
    assert block.language == "python"
    compile(block.code, block.where, "exec")
    command(block, tmp_path / "snippet.py")


@pytest.mark.spawns
@pytest.mark.timeout(200)
@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.where)
def test_runnable_block_runs(block: Block, tmp_path: Path) -> None:
    for module in needs(block):
        pytest.importorskip(module, reason=f"{block.where} needs {module}")
    script = tmp_path / "snippet.py"
    script.write_text(block.code)
    argv = command(block, script)
    if shutil.which(argv[0]) is None:
        pytest.skip(f"{block.where} runs under {argv[0]}, which is not installed")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=tmp_path,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, \
        f"{block.where} exited {done.returncode}:\n{done.stdout}\n{done.stderr[-4000:]}"
