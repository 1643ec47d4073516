"""deploy/systemd: the units pass ``systemd-analyze verify`` with no warning (where it is installed),
and their command lines are what ``servo-serve`` and ``servo-edge`` accept. The notify protocol
they rely on is driven in tests/cli/test_notify.py."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servo.cli import edge, serve

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
NAMES = ["servo-serve.service", "servo-edge.service"]


def service(name: str) -> dict[str, str]:
    """The unit's [Service] section (a key given twice keeps its last value)."""
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((UNITS / name).read_text())
    return dict(parser["Service"])


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here (Debian: systemd)")
@pytest.mark.parametrize("name", NAMES)
def test_the_unit_verifies_without_a_warning(name: str, tmp_path: Path) -> None:
    # The units name /opt/servo's commands; here they are the running interpreter's (the checkout's venv).
    unit = tmp_path / name
    unit.write_text((UNITS / name).read_text().replace("/opt/servo/bin/", f"{Path(sys.executable).parent}/"))
    command = shlex.split(service(name)["ExecStart"])[0].replace("/opt/servo/bin/", f"{Path(sys.executable).parent}/")
    if not Path(command).exists():
        pytest.skip(f"{command} is not installed in this environment")
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False)
    assert (result.returncode, result.stderr) == (0, "")


@pytest.mark.parametrize("name", NAMES)
def test_the_unit_is_a_watched_notify_service_that_stops_gracefully(name: str) -> None:
    unit = service(name)
    assert unit["Type"] == "notify"
    assert unit["NotifyAccess"] == "main"  # the control process never speaks for the edge
    assert unit["WatchdogSec"]
    assert unit["Restart"] == "on-failure"
    # SIGTERM to the main process only: the edge parks through its control process, which must tick on.
    assert (unit["KillSignal"], unit["KillMode"]) == ("SIGTERM", "mixed")
    assert unit["NoNewPrivileges"] == "yes"
    assert unit["ProtectSystem"] == "strict"


def test_the_commands_are_what_the_tools_accept() -> None:
    serve_argv = shlex.split(service("servo-serve.service")["ExecStart"])
    edge_argv = shlex.split(service("servo-edge.service")["ExecStart"])
    assert Path(serve_argv[0]).name == "servo-serve"
    assert Path(edge_argv[0]).name == "servo-edge"
    assert serve.build_parser().parse_args(serve_argv[1:]).manifest == "/etc/servo/manifest.toml"
    args = edge.build_parser().parse_args(edge_argv[1:])
    assert (args.config, args.no_status) == ("/etc/servo/edge.toml", True)


def test_the_edge_may_ask_for_its_real_time_priority() -> None:
    from servo.edge.realtime import REALTIME_PRIORITY

    assert int(service("servo-edge.service")["LimitRTPRIO"]) >= REALTIME_PRIORITY
    assert "RestrictRealtime" not in service("servo-edge.service")
