"""The files that decide whom a machine trusts are this user's alone, or refused in one line.

Issue 29: a ``robot.key`` that was a link to another user's file was used; a world-writable servo
directory was used silently; a ``known_servers`` owned by another user was accepted; and the
temporary file written beside ``known_servers`` followed a link and overwrote a file of root's.
The edge's run counter and the monitor's replay state follow the same rules.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from servo._core import ServerIdentity
from servo.client import UntrustedServer
from servo.client.known import KnownServers
from servo.edge.telemetry import next_run
from servo.identity import IdentityError, load_identity, robot_identity
from servo.monitor.trust import RobotTrust, TrustError
from servo.recording import EpisodeHeader, RecordingWriter
from servo.server.audit import AuditLog

#: A user id that is not this process's (files are given to it with chown, as root only).
OTHER_UID = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")


def other_users_identity(path: Path) -> Path:
    """A valid identity file owned by another user (mode 0600, as its owner would keep it)."""
    load_identity(path)
    os.chown(path, OTHER_UID, OTHER_UID)
    return path


@as_root
def test_a_robot_key_linked_to_another_users_file_is_refused(servo_config_dir: Path, tmp_path: Path) -> None:
    victim = other_users_identity(tmp_path / "their.key")
    servo_config_dir.mkdir(mode=0o700)
    (servo_config_dir / "robot.key").symlink_to(victim)
    with pytest.raises(IdentityError, match=r"robot\.key: identity key is a symbolic link.*remove it"):
        robot_identity()


@as_root
def test_a_key_of_another_user_is_refused_naming_the_owner(tmp_path: Path) -> None:
    key = other_users_identity(tmp_path / "robot.key")
    with pytest.raises(IdentityError, match=rf"robot\.key: identity key is owned by user {OTHER_UID}"):
        load_identity(key)


def test_a_servo_directory_others_may_write_is_refused_in_one_line(servo_config_dir: Path) -> None:
    servo_config_dir.mkdir(mode=0o700)
    servo_config_dir.chmod(0o777)
    command = [sys.executable, "-m", "servo.cli.edge", "--identity"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout
    (line,) = done.stderr.strip().splitlines()
    assert f"{servo_config_dir}: " in line
    assert "writable by others (mode 0777)" in line
    assert f"chmod go-w {servo_config_dir}" in line
    assert not (servo_config_dir / "robot.key").exists()  # nothing written where others could swap it


@as_root
def test_known_servers_of_another_user_are_refused(tmp_path: Path) -> None:
    known = KnownServers(tmp_path / "known_servers")
    known.replace("*/*", [ServerIdentity.generate().public_key])
    os.chown(known.path, OTHER_UID, OTHER_UID)
    with pytest.raises(UntrustedServer, match=rf"known_servers: known servers is owned by user {OTHER_UID}"):
        known.identities("*/*")


def test_writing_known_servers_never_follows_a_planted_link(tmp_path: Path) -> None:
    """The temporary file had a predictable name and was opened with O_TRUNC: whoever planted a
    link under that name (in a directory it could once write) had this user overwrite any file."""
    directory = tmp_path / "servo"
    directory.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    for name in (f".known_servers.{os.getpid()}", f".known_servers.{os.getpid()}.tmp"):
        (directory / name).symlink_to(victim)
    known = KnownServers(directory / "known_servers")
    identity = ServerIdentity.generate().public_key
    known.replace("*/*", [identity])
    assert victim.read_text() == "root's file\n"
    assert known.identities("*/*") == {identity}
    assert not known.path.is_symlink()


def test_known_servers_that_are_a_link_are_refused(tmp_path: Path) -> None:
    elsewhere = KnownServers(tmp_path / "elsewhere")
    elsewhere.replace("*/*", [ServerIdentity.generate().public_key])
    (tmp_path / "known_servers").symlink_to(elsewhere.path)
    with pytest.raises(UntrustedServer, match=r"known_servers: known servers is a symbolic link"):
        KnownServers(tmp_path / "known_servers").entries()


def test_the_run_counter_counts_once_per_run_across_threads_and_refuses_a_file_others_may_write(
    tmp_path: Path,
) -> None:
    """``telemetry.run`` decides which of a robot's records a monitor believes (runs count up): two
    edges starting at once must not share a number, and whoever may write it could make the
    robot's new records look like replays of old ones."""
    directory = tmp_path / "servo"
    directory.mkdir(mode=0o700)
    counter = directory / "telemetry.run"
    with ThreadPoolExecutor(8) as pool:
        runs = list(pool.map(lambda _: next_run(counter), range(40)))
    assert sorted(runs) == list(range(1, 41))
    assert stat.S_IMODE(counter.stat().st_mode) == 0o600
    assert [p.name for p in directory.iterdir()] == ["telemetry.run"]  # no temporary left behind
    counter.chmod(0o666)
    assert next_run(counter) > 10**18  # not counted there: numbered by the wall clock instead
    assert counter.read_text() == "40\n"
    victim = tmp_path / "victim"
    victim.write_text("7\n")
    counter.unlink()
    counter.symlink_to(victim)
    assert next_run(counter) > 10**18
    assert victim.read_text() == "7\n"


def test_a_monitor_state_others_may_write_or_a_link_is_refused_in_one_line(tmp_path: Path) -> None:
    """The state says which runs a monitor saw and which keys it trusted on first use: whoever may
    write it chooses which records and replicas the monitor believes."""
    directory = tmp_path / "servo"
    directory.mkdir(mode=0o700)
    state = directory / "monitor.state"
    trust = RobotTrust({"robot-7": ServerIdentity.generate().public_key}, state=state)
    assert trust.fresh("robot-7", 3, 1)
    trust.save()
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert not RobotTrust(state=state).fresh("robot-7", 3, 1)  # remembered across a restart
    state.chmod(0o666)
    with pytest.raises(TrustError, match=r"monitor\.state: monitor state is writable by others \(mode 0666\)"):
        RobotTrust(state=state)
    elsewhere = tmp_path / "elsewhere.state"
    state.rename(elsewhere)
    state.symlink_to(elsewhere)
    with pytest.raises(TrustError, match=r"monitor\.state: monitor state is a symbolic link"):
        RobotTrust(state=state)


def test_recordings_and_the_audit_log_are_created_for_this_user_alone(tmp_path: Path) -> None:
    """Review of issue 29: a robot's recording (its camera frames) and the server's audit log (every
    robot's requests) were created with the umask's mode: 0644, readable by every user of the machine."""
    previous = os.umask(0o022)
    try:
        RecordingWriter(tmp_path / "run.servo", EpisodeHeader(robot="sim", fps=30.0, joint_names=["j0"])).close()
        AuditLog(str(tmp_path / "audit.jsonl")).close()
    finally:
        os.umask(previous)
    for name in ("run.servo", "audit.jsonl"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
