"""The suite leaves the user's servo directory alone: a home that ``make demo`` used (foreign pins,
a robot key, a server key) is byte for byte the same after tests ran, and those tests pass.

The tests run in a child pytest whose ``HOME`` is a home made here, with neither
``SERVO_CONFIG_DIR`` nor ``XDG_CONFIG_HOME`` set, as on a user's machine. The files chosen start
a server and an edge in module-scoped fixtures (set up before any per-test fixture runs): the
place where a trust-on-first-use pin of the user's refused the suite's own server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from servo.home import CONFIG_DIR_VARIABLE
from servo.identity import ephemeral_identity, load_identity
from servo.wire import fingerprint

REPO = Path(__file__).resolve().parents[1]
# Module-scoped fixtures that open a server and edges that pin it.
MODULE_FIXTURE_TESTS = ["tests/trace/test_trace.py::test_a_whole_episode"]


def _used_home(home: Path) -> Path:
    """A servo directory as a demo leaves it, plus a pin no test server can match."""
    servo = home / ".config" / "servo"
    (servo / "servers").mkdir(parents=True, mode=0o700)
    load_identity(servo / "robot.key", role="robot")
    load_identity(servo / "servers" / "default.key")
    foreign = fingerprint(ephemeral_identity("server").public_key)
    known = servo / "known_servers"
    known.write_text(f"# servo known servers\n*/* {foreign}\n")
    known.chmod(0o600)
    return servo


def _snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every entry under ``root``: its mode and, for files, its bytes."""
    return {
        str(path.relative_to(root)): (path.lstat().st_mode, path.read_bytes() if path.is_file() else b"")
        for path in sorted(root.rglob("*"))
    }


def test_tests_run_on_a_used_home_pass_and_leave_it_byte_for_byte(tmp_path: Path) -> None:
    home = tmp_path / "home"
    servo = _used_home(home)
    before = _snapshot(servo)
    env = {k: v for k, v in os.environ.items() if k not in (CONFIG_DIR_VARIABLE, "XDG_CONFIG_HOME")}
    env["HOME"] = str(home)
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *MODULE_FIXTURE_TESTS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
    assert "1 passed" in child.stdout
    assert _snapshot(servo) == before
