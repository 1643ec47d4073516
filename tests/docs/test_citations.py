"""Every fact a docstring, message or page cites lives in the repository.

Design rules are cited as ``docs/design/<note>.md §n``: the page must exist and have section n.
Nothing may cite the design documents the project grew from, or any file users do not have.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.pages import ROOT

#: Where citations can hide: code, tests, benches and their results, examples, docs, deployment files, build files.
SEARCHED = ["python", "rust", "tests", "benches", "examples", "testbed", "docs", "deploy", ".ci"]
FILES = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md", "Makefile", "mkdocs.yml", "pyproject.toml", "Cargo.toml"]
TEXT = {".py", ".pyi", ".rs", ".md", ".toml", ".yml", ".yaml", ".json", ".txt", ".sh", ".service", ""}
#: Documents outside the repository (spelled in pieces, so this file does not cite them itself).
FOREIGN = re.compile("|".join(re.escape(p) for p in ("seeds" + "/", "ZENOH" + "_FACTS", "/work/" + "shared")))
SECTION_SIGN = r"(?:§|\\u00a7)"  # in JSON, § is written \u00a7
CITATION = re.compile(rf"(docs/(?:design|guides|getting-started)/[\w-]+\.md)((?:,? ?{SECTION_SIGN}\d+)*)")


def texts() -> list[Path]:
    found = [ROOT / name for name in FILES]
    for folder in SEARCHED:
        found += [
            p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in TEXT and "__pycache__" not in p.parts
        ]
    return found


def test_nothing_cites_a_document_outside_the_repository() -> None:
    hits = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}"
        for path in texts()
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if FOREIGN.search(line)
    ]
    assert hits == []


def test_every_cited_page_and_section_exists() -> None:
    cited = 0
    broken = []
    for path in texts():
        for page, sections in CITATION.findall(path.read_text(errors="replace")):
            cited += 1
            target = ROOT / page
            if not target.is_file():
                broken.append(f"{path.relative_to(ROOT)}: {page}")
                continue
            headings = set(re.findall(r"^## (\d+)\. ", target.read_text(), re.M))
            missing = [n for n in re.findall(SECTION_SIGN + r"(\d+)", sections) if n not in headings]
            broken += [f"{path.relative_to(ROOT)}: {page} §{n}" for n in missing]
    assert cited > 40  # the code's docstrings and messages cite the design notes
    assert broken == []
