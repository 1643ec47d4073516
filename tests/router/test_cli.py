"""``servo-router``: --check, exit codes, the ready line, a clean stop on SIGTERM/SIGINT.

`main` runs in-process only where it never configures logging (--check, refusals); anything that
starts the router runs as a process, as a user would run it.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from servo.cli.router import main
from tests.router.harness import Credentials, fleet_toml
from tests.support import free_port


def _fleet(creds: Credentials, tmp: Path, port: int) -> Path:
    path = tmp / "fleet.toml"
    path.write_text(fleet_toml("mtls", port, creds.pki, None))
    return path


def test_check_prints_the_acl_and_starts_nothing(
    creds: Credentials, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    assert main(["--check", str(_fleet(creds, tmp_path, port))]) == 0
    out, err = capsys.readouterr()
    acl = json.loads(out)
    assert acl["enabled"] is True
    assert acl["default_permission"] == "deny"
    assert {"id": "robot:robot-7", "cert_common_names": ["robot-7"]} in acl["subjects"]
    assert "is valid" in err
    assert "servers: 2, robots: 2, monitors: 1, routers: 0" in err
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # nothing listens there


def test_a_bad_fleet_file_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text('[router]\nlisten = ["tcp/127.0.0.1:7447"]\nlease = 5\n')
    assert main(["--check", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"servo-router: error: {path}: router.lease: unknown key "
        "(valid: connect, lease_ms, listen, passwords_file, tls)\n"
    )
    assert main([str(tmp_path / "missing.toml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def _router(fleet: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "servo.cli.router", str(fleet), *flags]


def test_a_busy_port_is_named_and_exit_1(creds: Credentials, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            _router(_fleet(creds, tmp_path, port)), capture_output=True, text=True, timeout=60, check=False
        )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"servo-router: error: router.listen[0] = 'tls/127.0.0.1:{port}': port {port} is already in use"
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_runs_until_a_signal_then_exits_0(creds: Credentials, tmp_path: Path, signum: signal.Signals) -> None:
    port = free_port()
    proc = subprocess.Popen(_router(_fleet(creds, tmp_path, port)), stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("servo-router: ready — router "), line
        assert f"listening on tls/127.0.0.1:{port}; members named by certificate common name" in line
        with pytest.raises(OSError):  # the router holds the port
            socket.create_server(("127.0.0.1", port))
        proc.send_signal(signum)
        _, rest = proc.communicate(timeout=15)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, rest
    assert rest.strip().splitlines()[-1] == "servo-router: stopped"
