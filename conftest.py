"""What every test and benchmark shares: a run never reads or writes the user's servo directory.

The directory is redirected twice:

* for the whole session, in `pytest_configure`, before any fixture runs: module- and
  session-scoped fixtures (servers, edges, fleets started once per file) and every process they
  start inherit ``SERVO_CONFIG_DIR`` from the environment;
* for every test, a fresh directory of its own (`servo_config_dir`), so one test's pins and
  identities never meet another's.

``tests/test_servo_home.py`` runs part of the suite against a home that holds foreign pins and
checks that home byte for byte afterwards.

``SERVO_TEST_HOG=N`` runs the session beside N busy-loop processes (`testbed.load.CpuHogs`),
started before the first test and killed after the last: the suite must hold at load (``make
test-slow`` sets 8).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from servo.home import CONFIG_DIR_VARIABLE
from testbed.load import CpuHogs

_SESSION_HOME = pytest.StashKey[Path]()
_HOGS = pytest.StashKey[CpuHogs]()
#: Busy loops beside the whole session (0 or unset: none).
HOG_VARIABLE = "SERVO_TEST_HOG"


def _hog_count() -> int:
    # Taken out of the environment: a pytest the suite runs in a child process adds no hogs.
    value = os.environ.pop(HOG_VARIABLE, "").strip() or "0"
    if not value.isdigit():
        raise pytest.UsageError(f"{HOG_VARIABLE} must be a number of busy loops, got {value!r}")
    return int(value)


def pytest_configure(config: pytest.Config) -> None:
    """Point ``SERVO_CONFIG_DIR`` at a directory of this run before anything can read it; start the hogs."""
    root = Path(tempfile.mkdtemp(prefix="servo-test-session-"))
    config.stash[_SESSION_HOME] = root
    os.environ[CONFIG_DIR_VARIABLE] = str(root / "servo")
    if count := _hog_count():
        hogs = config.stash[_HOGS] = CpuHogs(count)
        hogs.start()


def pytest_report_header(config: pytest.Config) -> str | None:
    """Say that the run is loaded, and by how much."""
    hogs = config.stash.get(_HOGS, None)
    return None if hogs is None else f"{HOG_VARIABLE}: {hogs.count} busy loops beside the run"


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the hogs; remove the run's directory (the environment dies with the process)."""
    hogs = config.stash.get(_HOGS, None)
    if hogs is not None:
        hogs.stop()
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
