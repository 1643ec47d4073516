"""``servo-monitor``'s command line: one line naming the problem, and the documented exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from servo.cli.monitor import main
from tests.support import free_port


def test_a_bad_option_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--http-port", "70000"]) == 2
    assert "http_port" in capsys.readouterr().err
    assert main(["--tls-cert", "a.pem"]) == 2
    assert "tls_key" in capsys.readouterr().err


def test_a_bad_robot_keys_file_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = tmp_path / "keys"
    keys.write_text("robot-7 not-a-fingerprint\n")
    port = free_port()
    assert main(["--robot-keys", str(keys), "--connect", f"tcp/127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert f"{keys} line 1" in err
    assert "Traceback" not in err


def test_nothing_to_join_is_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--connect", f"tcp/127.0.0.1:{free_port()}", "--http-port", "0"]) == 1
    assert "servo-monitor: error:" in capsys.readouterr().err
