"""The documentation site covers what it should: every page is in the nav, every public name of
``tensorcomm`` is on the API page, and every public module has an API page.

The site itself is built with ``mkdocs build --strict`` (the ``docs`` extra); these checks need
no MkDocs.
"""

from __future__ import annotations

import re
from pathlib import Path

import tensorcomm

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
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


def test_every_public_name_is_on_the_api_page() -> None:
    page = (DOCS / "api" / "tensorcomm.md").read_text()
    missing = [name for name in tensorcomm.__all__
               if f"::: tensorcomm.{name}\n" not in page and f"`{name}`" not in page
               and f"`tensorcomm.{name}" not in page]
    assert missing == []


def test_every_public_module_has_an_api_page() -> None:
    text = "".join(p.read_text() for p in (DOCS / "api").glob("*.md"))
    assert [m for m in PUBLIC_MODULES if f"::: {m}" not in text] == []
