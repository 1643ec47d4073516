"""``servo-serve robots``: tokens, revocations and API keys without editing a file, one-line errors."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from servo.cli.console import Console
from servo.cli.robots import main
from servo.home import roster_path
from servo.identity import server_identity
from servo.join import JoinToken
from servo.server.joins import advertise
from servo.server.roster import Advertised, Roster
from servo.wire import fingerprint


def robots(*argv: str) -> int:
    return main(list(argv), Console(live=False))


def test_a_token_comes_with_the_command_of_the_server_that_last_started(capsys: pytest.CaptureFixture[str]) -> None:
    identity = server_identity("", "default")
    pin = bytes(range(32))
    advertised = Advertised(fingerprint(identity.public_key), pin.hex(), ["tls/127.0.0.1:7447"])
    Roster(roster_path("default")).change(lambda f: advertise(f, advertised))
    assert robots("token", "--uses", "3", "--ttl", "2h", "--name", "robot-7") == 0
    out, err = capsys.readouterr()
    command = out.strip()
    assert command.startswith("servo-edge --robot ROBOT --client-id robot-7 --connect tls/127.0.0.1:7447 --join ")
    token = JoinToken.parse(command.rsplit(" ", 1)[1])
    assert token.server == identity.public_key
    assert token.certificate == pin
    assert f"join token {token.id} for 3 robots" in err
    (kept,) = Roster(roster_path("default")).read().tokens
    assert (kept.id, kept.uses, kept.name) == (token.id, 3, "robot-7")
    assert kept.expires == pytest.approx(time.time() + 7200, abs=60)


def test_list_revoke_and_api_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert robots("api-key", "lab-pc", "--ttl", "30d") == 0
    key = capsys.readouterr().out.strip()
    assert key.startswith("servo-api-v1.")
    assert robots("api-key", "lab-pc") == 2
    assert "'lab-pc' holds an API key already" in capsys.readouterr().err
    assert robots("token") == 0
    token_id = JoinToken.parse(capsys.readouterr().out.split()[-1]).id
    assert robots("revoke-token", token_id) == 0
    assert robots("list") == 0
    listing = capsys.readouterr().out
    assert f"{token_id}  join token {token_id} was revoked" in listing
    assert "lab-pc  id " in listing
    assert key not in listing
    assert robots("revoke-key", "lab-pc") == 0
    assert Roster(roster_path("default")).read().api_keys == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["revoke", "robot-9"], "'robot-9': no robot of that name joined this server"),
        (["revoke-token", "abcdefgh"], "'abcdefgh': no join token with that id"),
        (["revoke-key", "nobody"], "'nobody': holds no API key"),
        (["--app", "a/b", "list"], "--app 'a/b' contains '/'"),
    ],
)
def test_mistakes_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert robots(*argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("servo-serve robots: error: ")
    assert message in line


def test_servo_serve_robots_is_a_subcommand_with_help(servo_config_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "servo.cli.serve", "robots", "token", "--ttl", "soon"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "expected a duration like 90s, 30m, 1h or 2d, got 'soon'" in done.stderr
    helped = subprocess.run(
        [sys.executable, "-m", "servo.cli.serve", "robots", "--help"], capture_output=True, text=True, timeout=60
    )
    assert helped.returncode == 0
    for command in ("list", "token", "revoke", "revoke-token", "api-key", "revoke-key"):
        assert command in helped.stdout
