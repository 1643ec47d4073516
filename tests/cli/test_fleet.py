"""``servo-fleet up``: a local fleet in one command, seen streaming on the monitor, gone after Ctrl-C;
and ``servo-serve --connect/--replica``, the flags its replicas join the router with."""

from __future__ import annotations

import json
import re
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from servo.cli.fleet import main as fleet_main
from servo.cli.serve import build_parser, read_manifest
from servo.config import ConfigError
from tests.edge.harness import Proc
from tests.support import free_port


def fleet_up(directory: Path, *args: str) -> Proc:
    return Proc([sys.executable, "-m", "servo.cli.fleet", "up", "--dir", str(directory), *args])


def descendants(root: int) -> dict[int, str]:
    """Every process under ``root``, pid -> its start time (so a reused pid is not mistaken for it)."""
    parents: dict[int, list[int]] = {}
    started: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        parents.setdefault(int(fields[1]), []).append(pid)
        started[pid] = fields[19]
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found[child] = started[child]
            todo.append(child)
    return found


def alive(processes: dict[int, str]) -> list[int]:
    out = []
    for pid, start in processes.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[19] == start and fields[0] != "Z":
            out.append(pid)
    return out


def fleet_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}api/fleet", timeout=5) as reply:
        data: dict[str, Any] = json.load(reply)
        return data


def wait_until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except OSError as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout} s (last: {last!r})")


@pytest.mark.deploy
def test_up_shows_the_robots_streaming_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    fleet = fleet_up(tmp_path / "fleet", "--replicas", "2", "--robots", "3", "--http-port", "0")
    try:
        line = fleet.wait_line("monitor on http://", 240)
        url = re.search(r"http://\S+/", line)
        assert url is not None, line
        robots = {f"robot-{i}" for i in range(3)}

        def streaming() -> dict[str, Any] | None:
            view = fleet_json(url.group(0))
            states = {robot["id"]: robot["state"] for robot in view["robots"]}
            return view if states == dict.fromkeys(robots, "streaming") else None

        view = wait_until(streaming, 120, "three robots streaming on the monitor")
        assert {replica["replica"] for replica in view["replicas"] if replica["up"]} == {"replica-0", "replica-1"}
        assert all(robot["pinned"] for robot in view["robots"])  # the generated robot keys, pinned
        assert view["refused"] == {}  # every record encrypted to the monitor, by a robot it knows
        members = descendants(fleet.popen.pid)
        assert len(members) >= 1 + 2 + 3 * 2 + 1  # router, replicas, robots and their control processes, monitor

        fleet.popen.send_signal(signal.SIGINT)
        assert fleet.wait(90) == 0, fleet.output
        assert "every member exited cleanly" in fleet.output
        assert alive(members) == []
        logs = tmp_path / "fleet" / "logs"
        assert "servo-serve: stopped" in (logs / "replica-0.log").read_text()
        for robot in robots:  # stopped by the fleet, each parked its arm
            summary = json.loads((logs / f"{robot}.summary.json").read_text())
            assert (summary["stop_reason"], summary["parked"]) == ("signal", True)
    finally:
        fleet.kill()


@pytest.mark.deploy
def test_a_killed_fleet_leaves_nothing_behind(tmp_path: Path) -> None:
    fleet = fleet_up(tmp_path / "fleet", "--replicas", "1", "--robots", "1", "--no-monitor")
    try:
        fleet.wait_line("ready — Ctrl-C", 240)
        # router, replica, robot and the robot's control process (which the robot starts meanwhile)
        members = wait_until(
            lambda: found if len(found := descendants(fleet.popen.pid)) >= 4 else None, 60, "four processes"
        )
        fleet.kill()  # SIGKILL: no chance to stop anything itself
        wait_until(lambda: alive(members) == [], 60, "every member ended by the kernel")
    finally:
        fleet.kill()


@pytest.mark.deploy
def test_a_member_that_cannot_start_is_named_with_its_log(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        fleet = fleet_up(tmp_path / "fleet", "--replicas", "1", "--robots", "0", "--http-port", str(port))
        try:
            assert fleet.wait(240) == 1, fleet.output
        finally:
            fleet.kill()
    assert "servo-fleet: error: monitor exited with status" in fleet.output
    assert f"{tmp_path / 'fleet' / 'logs' / 'monitor.log'} ends with:" in fleet.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replicas", "0"], "--replicas: between 1 and 16"),
        (["--robots", "65"], "--robots: between 0 and 64"),
        (["--http-port", "70000"], "--http-port: a port number"),
    ],
)
def test_bad_options_are_one_line(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert fleet_main(["up", *args]) == 2
    assert f"servo-fleet: error: {message}" in capsys.readouterr().err


def test_a_used_directory_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "fleet.toml").write_text("mine\n")
    assert fleet_main(["up", "--dir", str(tmp_path)]) == 2
    assert "--dir: " in capsys.readouterr().err
    assert (tmp_path / "fleet.toml").read_text() == "mine\n"


# ---------------------------------------------------------------------------- servo-serve's flags
def manifest_with(tmp_path: Path, *args: str) -> Any:
    path = tmp_path / "manifest.toml"
    path.write_text('[model]\nsource = "reference"\n[zenoh]\nmode = "peer"\nlisten = ["tcp/127.0.0.1:7447"]\n')
    return read_manifest(build_parser().parse_args([str(path), *args]))


def test_connect_joins_a_router_as_its_client(tmp_path: Path) -> None:
    port = free_port()
    manifest = manifest_with(tmp_path, "--connect", f"tcp/127.0.0.1:{port}", "--replica", "gpu-3")
    assert (manifest.zenoh.mode, manifest.zenoh.listen) == ("client", [])
    assert manifest.zenoh.connect == [f"tcp/127.0.0.1:{port}"]
    assert manifest.serving.replica == "gpu-3"


def test_connect_beside_listen_still_needs_its_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"zenoh\.listen.*--listen-beside-router"):
        manifest_with(tmp_path, "--connect", "tcp/127.0.0.1:7448", "--listen", "tcp/127.0.0.1:7449")


def test_a_bad_replica_name_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"serving\.replica"):
        manifest_with(tmp_path, "--replica", "a/b")
