"""The distribution is servo-robotics (PyPI's `servo` is someone else's); every install hint says so."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import servo

REPO = Path(__file__).resolve().parent.parent


def test_installed_under_its_distribution_name_at_the_rust_core_version() -> None:
    # pyproject.toml and Cargo.toml each carry the version; a release bumping one must bump both.
    assert importlib.metadata.version("servo-robotics") == servo.__version__


def test_every_pip_install_names_servo_robotics() -> None:
    texts = [REPO / "README.md", *REPO.glob("docs/**/*.md"), *REPO.glob("python/**/*.py"), *REPO.glob("examples/*.py")]
    hints = [
        (path.name, target)
        for path in texts
        for target in re.findall(r"""pip install ['"]?([^\s`'"]+)""", path.read_text())
    ]
    assert len(hints) >= 5, hints  # install tables, cameras note, wheel example, camera error + docstring
    assert [h for h in hints if not h[1].startswith(("servo-robotics", "dist/servo_robotics-"))] == []
