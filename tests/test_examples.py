"""Every example runs (as a user would run it) and exits 0; the demo refuses busy ports."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from tests.support import free_port, make_manifest, running_server

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_demo_runs_server_and_sim_arm() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "demo.py"),
            "--duration",
            "2",
            "--port",
            str(free_port()),
            "--health-port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"final_state": "streaming"' in done.stdout
    assert "servo-serve: stopped" in done.stderr


@pytest.mark.parametrize("which", ["zenoh", "health"])
def test_demo_refuses_a_busy_port_with_advice_that_works_through_make(which: str) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        held = other.getsockname()[1]
        port, health_port = (held, free_port()) if which == "zenoh" else (free_port(), held)
        ports = ["--port", str(port), "--health-port", str(health_port)]
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / "demo.py"), *ports], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 2, done.stderr[-3000:]
        setting = f"zenoh.listen tcp/127.0.0.1:{held}" if which == "zenoh" else "ops.health_port on 127.0.0.1"
        # servo-serve's refusal (relayed), then the same free ports as the demo's flags: nothing started.
        refusal, line = done.stderr.splitlines()
        assert refusal.startswith(f"servo-serve: error: port {held} ({setting}) is already in use")
        assert line.startswith(
            "demo: error: servo-serve exited with 2 before it was ready; stop the other server, or choose free "
            "ports: make demo DEMO_ARGS='"
        )
        assert done.stdout == ""
        demo_args = line.split("DEMO_ARGS='", 1)[1].split("'", 1)[0]
        flag = "--port" if which == "zenoh" else "--health-port"
        assert demo_args.split()[0] == flag
        assert refusal.endswith(demo_args.split()[1])  # the same free port servo-serve named
        # make passes DEMO_ARGS on to the demo (a dry run: nothing is built or installed) ...
        planned = subprocess.run(
            ["make", "-n", "demo", f"DEMO_ARGS={demo_args}"], cwd=EXAMPLES.parent, capture_output=True, text=True
        )
        (demo_line,) = [line for line in planned.stdout.splitlines() if "examples/demo.py" in line]
        assert demo_line.endswith(f"examples/demo.py --duration 15 {demo_args}")
        # ... and the demo with them runs while the port stays taken (the other one as it was).
        given = dict(zip(ports[::2], ports[1::2], strict=True)) | dict([demo_args.split()])
        moved = subprocess.run(
            [sys.executable, str(EXAMPLES / "demo.py"), "--duration", "2", *(a for kv in given.items() for a in kv)],
            capture_output=True,
            text=True,
            timeout=150,
            check=False,
        )
    assert moved.returncode == 0, moved.stderr[-3000:]
    assert '"final_state": "streaming"' in moved.stdout


@pytest.mark.anyio
async def test_client_quickstart(port: int) -> None:
    async with running_server(make_manifest(port)):
        done = await anyio.run_process(
            [
                sys.executable,
                str(EXAMPLES / "client_quickstart.py"),
                "--connect",
                f"tcp/127.0.0.1:{port}",
                "--requests",
                "3",
            ],
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    out = done.stdout.decode()
    assert "found 1 server(s)" in out
    assert out.count("chunk (50, 6)") == 3


def test_example_manifest_is_valid() -> None:
    from servo.server.manifest import load_manifest

    manifest = load_manifest(EXAMPLES / "manifest.toml")
    assert manifest.model.device == "cpu"
    assert manifest.zenoh.listen == ["tcp/127.0.0.1:7447"]


def test_example_edge_config_names_every_option_at_its_default() -> None:
    from servo.edge.config import FLAG_KEYS, EdgeConfig, load_edge_config

    assert load_edge_config(str(EXAMPLES / "edge.toml")) == EdgeConfig()
    text = (EXAMPLES / "edge.toml").read_text()
    listed = {line.split("=")[0].strip() for line in text.splitlines() if "=" in line.split("#")[0]}
    assert listed == set(FLAG_KEYS)


def test_example_fleet_file_checks(tmp_path: Path) -> None:
    """`servo-router --check` accepts the example once its certificates exist (paths are relative to it)."""
    from tests.pki import Pki

    fleet = tmp_path / "fleet.toml"
    fleet.write_text((EXAMPLES / "fleet.toml").read_text())
    Pki(tmp_path / "certs", "ca").issue("router", ip="127.0.0.1")
    done = subprocess.run(
        [sys.executable, "-m", "servo.cli.router", "--check", str(fleet)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    acl = json.loads(done.stdout)
    subjects = {s["id"]: s for s in acl["subjects"]}
    assert subjects["robot:robot-7"] == {"id": "robot:robot-7", "cert_common_names": ["robot-7"]}
    assert subjects["servers[1]"]["cert_common_names"] == ["gpu-kitchen"]
    assert "servers: 3, robots: 2, monitors: 1, routers: 0" in done.stderr


def test_the_ros2_example_manifest_prints_a_robot_its_arm_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    from servo.robots import RobotDescription
    from servo.robots.so100_joints import JOINT_NAMES
    from servo.server.manifest import load_manifest

    manifest = load_manifest(EXAMPLES / "ros2" / "manifest.toml")
    assert manifest.robot is not None
    assert manifest.robot.type == "ros2"
    monkeypatch.chdir(EXAMPLES.parent)  # its urdf= is a path in a checkout, as docs/guides/ros2.md runs it
    spec = RobotDescription("ros2", manifest.robot.option_text()).spec()
    assert list(spec.joint_names) == list(JOINT_NAMES)
    assert set(spec.cameras) == set(manifest.model.options["cameras"])
