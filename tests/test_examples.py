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
def test_demo_refuses_a_busy_port_instead_of_driving_another_server(which: str) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        held = other.getsockname()[1]
        port, health_port = (held, free_port()) if which == "zenoh" else (free_port(), held)
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / "demo.py"), "--port", str(port), "--health-port", str(health_port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 2, done.stderr[-3000:]
    setting = f"zenoh.listen tcp/127.0.0.1:{held}" if which == "zenoh" else "ops.health_port on 127.0.0.1"
    # servo-serve's own refusal, relayed, then the demo's advice: nothing else started.
    assert done.stderr.splitlines() == [
        f"servo-serve: error: port {held} ({setting}) is already in use (another servo-serve?); "
        "stop it or choose free ports with --listen, --health-port",
        "demo: error: servo-serve exited with 2 before it was ready; choose free ports with --port, --health-port",
    ]
    assert done.stdout == ""


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
