"""Identity files (a server's, a robot's): created 0600 and kept, refused when others can read them;
the user's servo directory they live in by default."""

from __future__ import annotations

import logging
import os
import stat
import threading
from pathlib import Path

import pytest

from servo.home import CONFIG_DIR_VARIABLE, config_dir, known_servers_path, robot_identity_path
from servo.identity import IdentityError, ephemeral_identity, load_identity, robot_identity, server_identity
from servo.wire import fingerprint


def test_a_missing_identity_is_created_private_then_reused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="servo")
    path = tmp_path / "server.key"
    first = load_identity(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().startswith("servo-identity-v1 ")
    created = [r.msg for r in caplog.records if "identity created" in str(r.msg)]
    assert len(created) == 1
    assert fingerprint(first.public_key) in str(created[0])  # the fingerprint, never the seed
    assert first.seed.hex() not in caplog.text
    again = load_identity(path)
    assert again.public_key == first.public_key  # replicas sharing the file share the identity


def test_an_ephemeral_identity_is_new_every_time() -> None:
    assert ephemeral_identity().public_key != ephemeral_identity().public_key


def test_an_identity_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "server.key"
    load_identity(path)
    os.chmod(path, 0o644)
    with pytest.raises(
        IdentityError, match=r"server.key: identity key is accessible by others \(mode 0644\); chmod 600"
    ):
        load_identity(path)


@pytest.mark.parametrize("text", ["", "hello", "servo-identity-v1 abc", "-----BEGIN PRIVATE KEY-----\nMC4CAQAw\n"])
def test_a_file_that_is_no_identity_is_refused_in_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "server.key"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(IdentityError, match=r"server\.key: not a servo identity key"):
        load_identity(path)


def test_an_unwritable_place_is_named(tmp_path: Path) -> None:
    with pytest.raises(IdentityError, match="cannot create the identity key"):
        load_identity(tmp_path / "no" / "such" / "dir" / "server.key")


def test_every_test_gets_a_servo_directory_of_its_own(tmp_path: Path) -> None:
    """The autouse fixture (tests/conftest.py): nothing a test creates reaches the user's home."""
    assert config_dir() == Path(os.environ[CONFIG_DIR_VARIABLE])
    assert not config_dir().exists()  # created on first use only
    assert Path.home() not in config_dir().parents


def test_the_servo_directory_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(CONFIG_DIR_VARIABLE)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_dir() == tmp_path / "xdg" / "servo"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert config_dir() == tmp_path / "home" / ".config" / "servo"
    monkeypatch.setenv(CONFIG_DIR_VARIABLE, str(tmp_path / "explicit"))
    assert config_dir() == tmp_path / "explicit"
    assert known_servers_path() == tmp_path / "explicit" / "known_servers"


def test_default_identities_live_private_in_the_servo_directory() -> None:
    robot = robot_identity()
    assert robot_identity_path().is_file()
    assert stat.S_IMODE(config_dir().stat().st_mode) == 0o700
    assert robot_identity().public_key == robot.public_key  # kept across runs
    demo, other = server_identity("", "demo"), server_identity("", "kitchen")
    assert stat.S_IMODE((config_dir() / "servers").stat().st_mode) == 0o700
    assert (config_dir() / "servers" / "demo.key").is_file()
    assert len({robot.public_key, demo.public_key, other.public_key}) == 3
    assert server_identity("", "demo").public_key == demo.public_key


def test_an_explicit_path_wins_over_the_default(tmp_path: Path) -> None:
    path = tmp_path / "arm.key"
    assert robot_identity(path).public_key == load_identity(path).public_key
    assert not robot_identity_path().exists()


def test_processes_creating_one_identity_at_once_all_get_it_whole(tmp_path: Path) -> None:
    """Bench clients start by the dozen on one servo directory: the file appears complete or not
    at all, so none reads it half written, and all share the one that won."""
    path = tmp_path / "robot.key"
    start = threading.Barrier(8)
    keys: list[bytes] = []

    def load() -> None:
        start.wait()
        keys.append(load_identity(path, role="robot").public_key)

    threads = [threading.Thread(target=load) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(keys) == 8
    assert len(set(keys)) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["robot.key"]  # no staging file left behind
