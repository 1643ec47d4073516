"""The site as built: strict, searchable offline, and with a reference entry for every public name.

``make docs`` builds the site and runs this module against it (``SERVO_DOCS_SITE=site``); run alone,
it builds the site itself with ``mkdocs build --strict`` into a temporary directory (slow: tens
of seconds of CPU).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import servo
from tests.docs.pages import ROOT, generator
from tests.docs.search import SearchIndex

pytestmark = pytest.mark.slow

#: What a new user asks the search box, and the page that must come first.
QUESTIONS = [
    ("serve a LeRobot checkpoint", "guides/lerobot/"),
    ("join a robot to a LAN server", "guides/join/"),
    ("runbook", "guides/operations/"),
    ("robot stuttered", "guides/operations/"),
    ("install", "getting-started/install/"),
    ("threat model", "guides/security/"),
    ("failure modes", "guides/failure-modes/"),
    ("kubernetes", "guides/deploy/"),
    ("join token", "guides/join/"),
    ("every step once", "guides/exactness/"),
]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = os.environ.get("SERVO_DOCS_SITE")
    if built:
        return (ROOT / built).resolve()
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.parametrize(("question", "page"), QUESTIONS)
def test_search_finds_the_page_that_answers(site: Path, question: str, page: str) -> None:
    results = SearchIndex(site / "search" / "search_index.json").search(question)
    assert results, question
    assert results[0].page == page, [r.location for r in results[:5]]


def inventory(site: Path) -> set[str]:
    """The objects the API reference documents (Sphinx inventory v2, which mkdocstrings writes)."""
    data = (site / "objects.inv").read_bytes()
    body = data.split(b"\n", 4)[4]
    return {line.split(" ", 1)[0] for line in zlib.decompress(body).decode().splitlines() if line}


def test_every_public_name_has_a_reference_entry(site: Path) -> None:
    api = generator("reference_api").collect(ROOT / "python")
    documented = inventory(site)
    top = {entry.name for entry in api.entries if entry.top_level}
    assert top == set(servo.__all__) - {"__version__"}
    assert {entry.path for entry in api.entries} - documented == set()


def test_every_generated_reference_page_is_built(site: Path) -> None:
    for page in ("reference/cli", "reference/manifest", "reference/edge-config", "reference/fleet", "reference/api"):
        assert (site / page / "index.html").is_file(), page
    html = (site / "reference" / "cli" / "index.html").read_text()
    assert "servo-edge trust" in html
    assert "--robot-opt" in html
