"""Links: the README is a short landing page whose links resolve; external links are well formed.

Links between pages of the site are checked by ``mkdocs build --strict`` (``make docs``). This covers
the Markdown read outside the site (README, CONTRIBUTING, CHANGELOG) and every external link,
which CI cannot fetch (no network): each is listed here, so adding one is a reviewed decision, and
checked for shape.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.docs.pages import ROOT, TOP_LEVEL, anchors, links, markdown_files

#: Every external link of the documentation.
EXTERNAL = {
    "https://cyclonedds.io",
    "https://keepachangelog.com/en/1.1.0/",
    "https://rerun.io",
    "https://semver.org/spec/v2.0.0.html",
    "https://zenoh.io",
}
_HOST = re.compile(r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")


def test_readme_is_a_short_landing_page_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 400
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    assert "make demo\n" in blocks
    assert "make test\n" in blocks
    assert {"docs/guides/lerobot.md", "docs/guides/operations.md", "docs/guides/join.md"} <= set(
        links(ROOT / "README.md")
    )


@pytest.mark.parametrize("page", TOP_LEVEL, ids=lambda path: path.name)
def test_relative_links_outside_the_site_resolve(page: Path) -> None:
    broken = []
    for target in links(page):
        if urlsplit(target).scheme:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists() or (anchor and anchor not in anchors(resolved)):
            broken.append(target)
    assert broken == []


def test_external_links_are_listed_and_well_formed() -> None:
    found = {target for page in markdown_files() for target in links(page) if urlsplit(target).scheme}
    assert found == EXTERNAL
    for url in found:
        parts = urlsplit(url)
        assert parts.scheme == "https", url
        assert _HOST.match(parts.hostname or ""), url
        assert parts.username is None, url
        assert parts.port is None, url
        assert " " not in url, url
