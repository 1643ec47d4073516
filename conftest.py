"""What every test and benchmark shares: a run never reads or writes the user's servo directory.

The directory is redirected twice:

* for the whole session, in `pytest_configure`, before any fixture runs: module- and
  session-scoped fixtures (servers, edges, fleets started once per file) and every process they
  start inherit ``SERVO_CONFIG_DIR`` from the environment;
* for every test, a fresh directory of its own (`servo_config_dir`), so one test's pins and
  identities never meet another's.

``tests/test_servo_home.py`` runs part of the suite against a home that holds foreign pins and
checks that home byte for byte afterwards.

A run also never listens on the machine's network: as root (CI), `pytest_configure` moves the
session into a network namespace of its own before any socket exists, with loopback and one
private address standing for a LAN (`PRIVATE_LAN_ADDRESS`, on a veth pair of the namespace). The
tests that take the CLI's LAN set-up (``tls/0.0.0.0``) are marked ``wildcard`` and are skipped
where no namespace could be made, so they never open a port on a real network.
``SERVO_TEST_NETWORK=host`` keeps the host's network: the image tests need it, since building an
image fetches packages.

``SERVO_TEST_HOG=N`` runs the session beside N busy-loop processes (`testbed.load.CpuHogs`),
started before the first test and killed after the last: the suite must hold at load (``make
test-slow`` sets 8).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from servo.home import CONFIG_DIR_VARIABLE
from testbed.load import CpuHogs

_SESSION_HOME = pytest.StashKey[Path]()
_PRIVATE_NETWORK = pytest.StashKey[bool]()
_HOGS = pytest.StashKey[CpuHogs]()
#: Busy loops beside the whole session (0 or unset: none).
HOG_VARIABLE = "SERVO_TEST_HOG"


def _hog_count() -> int:
    # Taken out of the environment: a pytest the suite runs in a child process adds no hogs.
    value = os.environ.pop(HOG_VARIABLE, "").strip() or "0"
    if not value.isdigit():
        raise pytest.UsageError(f"{HOG_VARIABLE} must be a number of busy loops, got {value!r}")
    return int(value)


PRIVATE_LAN_ADDRESS = "10.254.0.1"
"""This host's address on the session's private LAN: where ``tls/0.0.0.0`` listens are reached."""

_CLONE_NEWNET = 0x40000000
_LAN_SETUP = (
    ("link", "set", "lo", "up"),
    ("link", "add", "servo-lan", "type", "veth", "peer", "name", "servo-lan-end"),
    ("link", "set", "servo-lan-end", "up"),
    ("addr", "add", f"{PRIVATE_LAN_ADDRESS}/24", "dev", "servo-lan"),
    ("link", "set", "servo-lan", "up"),
    # A default route, so "which address would reach the network" (the printed commands) has an answer.
    ("route", "add", "default", "dev", "servo-lan"),
)


def _enter_private_network() -> bool:
    """Move this process (and every thread and process it starts later) into a new network namespace.

    Runs before pytest starts any thread: a namespace is per thread, and later threads and
    children inherit the one of the thread that makes them. Any failure returns to the host's
    namespace, so a run without root works as before, without the ``wildcard`` tests.
    """
    if os.environ.get("SERVO_TEST_NETWORK") == "host" or os.geteuid() != 0:
        return False
    host = os.open("/proc/self/ns/net", os.O_RDONLY)
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        if libc.unshare(_CLONE_NEWNET) != 0:
            return False
        try:
            for args in _LAN_SETUP:
                subprocess.run(["ip", *args], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError):
            libc.setns(host, _CLONE_NEWNET)
            return False
        return True
    finally:
        os.close(host)


def pytest_configure(config: pytest.Config) -> None:
    """Point ``SERVO_CONFIG_DIR`` at this run's directory before anything reads it; enter its network; start hogs."""
    root = Path(tempfile.mkdtemp(prefix="servo-test-session-"))
    config.stash[_SESSION_HOME] = root
    os.environ[CONFIG_DIR_VARIABLE] = str(root / "servo")
    config.stash[_PRIVATE_NETWORK] = _enter_private_network()
    if count := _hog_count():
        hogs = config.stash[_HOGS] = CpuHogs(count)
        hogs.start()


def in_private_network(config: pytest.Config) -> bool:
    """Whether this run listens on a network namespace of its own."""
    return config.stash.get(_PRIVATE_NETWORK, False)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Say which network the run listens on, and whether it runs loaded."""
    if in_private_network(config):
        lines = [f"network: a namespace of this run (loopback, LAN address {PRIVATE_LAN_ADDRESS})"]
    else:
        lines = ["network: the host's (tests marked wildcard are skipped: they need root for a namespace of their own)"]
    hogs = config.stash.get(_HOGS, None)
    return lines if hogs is None else [*lines, f"{HOG_VARIABLE}: {hogs.count} busy loops beside the run"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests that listen on every interface when the run has no network of its own."""
    if in_private_network(config):
        return
    skip = pytest.mark.skip(reason="listens on 0.0.0.0: runs only in a network namespace of the test run (root)")
    for item in items:
        if item.get_closest_marker("wildcard"):
            item.add_marker(skip)


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
