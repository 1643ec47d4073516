"""What the docs tests share: the repository's Markdown, its links, and the reference generators."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from types import ModuleType

from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: Markdown outside docs/ that is part of the documentation (read on GitHub, or included in the site).
TOP_LEVEL = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md"]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.M)
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def markdown_files() -> list[Path]:
    """Every Markdown page of the documentation."""
    return sorted(DOCS.rglob("*.md")) + TOP_LEVEL


def links(path: Path) -> list[str]:
    """The targets of a page's Markdown links (code blocks left out)."""
    return _LINK.findall(_FENCE.sub("", path.read_text()))


def anchors(path: Path) -> set[str]:
    """The ids of a page's headings, as the site's table of contents makes them."""
    return {slugify(title.replace("`", ""), "-") for title in _HEADING.findall(_FENCE.sub("", path.read_text()))}


def generator(name: str) -> ModuleType:
    """A module of ``docs/_gen`` (they import each other by plain name, as MkDocs loads them)."""
    folder = str(DOCS / "_gen")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)
