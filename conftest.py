"""What every test and benchmark shares: a run never reads or writes the user's servo directory.

The directory is redirected twice:

* for the whole session, in `pytest_configure`, before any fixture runs: module- and
  session-scoped fixtures (servers, edges, fleets started once per file) and every process they
  start inherit ``SERVO_CONFIG_DIR`` from the environment;
* for every test, a fresh directory of its own (`servo_config_dir`), so one test's pins and
  identities never meet another's.

``tests/test_servo_home.py`` runs part of the suite against a home that holds foreign pins and
checks that home byte for byte afterwards.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from servo.home import CONFIG_DIR_VARIABLE

_SESSION_HOME = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Point ``SERVO_CONFIG_DIR`` at a directory of this run before anything can read it."""
    root = Path(tempfile.mkdtemp(prefix="servo-test-session-"))
    config.stash[_SESSION_HOME] = root
    os.environ[CONFIG_DIR_VARIABLE] = str(root / "servo")


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the run's directory (the environment dies with the process)."""
    root = config.stash.get(_SESSION_HOME, None)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def servo_config_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, not yet created servo directory for every test (identities, known servers).

    Set in the environment, so processes a test starts use it too.
    """
    path = tmp_path_factory.mktemp("servo-home") / "servo"
    monkeypatch.setenv(CONFIG_DIR_VARIABLE, str(path))
    return path
