"""Every ``servo-edge`` command ``servo-serve`` prints, run as printed, for each kind of policy it prints for.

An SO arm's policy (six SO-100 joints) at 15 fps: the SO-101 command on the emulated Feetech bus
(the machine's own values in place of ``PORT`` and ``ARM``) and the sim's. A 7-joint policy at
15 fps with a camera the sim does not have: only the sim's, which takes the policy's joints, rate
and camera. A 14-joint policy whose forward outlasts the edge's default buffer: the sim's, with the
``--buffer-time-s`` the capacity plan asks for. Only run options (``--duration``, ``--summary``,
``--no-status``) are added. The ROS 2 robot's printed command is run in tests/test_ros2_readme.py.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from servo.recording import read_recording
from tests.edge.harness import Proc
from tests.robots.calib_data import CALIBRATION, store_calibration, write_calibration
from tests.robots.feetech_emulator import FeetechEmulator
from tests.support import free_port

MANIFEST = """
[model]
source = "reference"
warmup = 1
[model.options]
{options}
[zenoh]
listen = ["{listen}"]
[ops]
health_port = 0
"""


def names(n: int) -> str:
    return "joint_names = [" + ", ".join(f'"joint_{i}.pos"' for i in range(n)) + "]"


def serve(tmp_path: Path, options: str, listen: str = "tcp/127.0.0.1:{port}") -> tuple[Proc, int]:
    port = free_port()
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(MANIFEST.format(options=options, listen=listen.format(port=port)))
    proc = Proc([sys.executable, "-m", "servo.cli.serve", str(manifest), "--log-level", "warning"])
    try:
        proc.wait_line("servo-serve: ready", 120)
    except BaseException:
        proc.kill()
        raise
    return proc, port


def printed(proc: Proc, label: str) -> list[str] | None:
    """The command after ``label`` (as argv), or None when the server printed none."""
    prefix = f"servo-serve: {label}: "
    lines = [line for line in proc.lines if line.startswith(prefix)]
    return shlex.split(lines[0][len(prefix) :]) if lines else None


def run_as_printed(argv: list[str], tmp_path: Path, *, env: dict[str, str] | None = None) -> dict[str, object]:
    """Run a printed ``servo-edge`` command for a few seconds; its run summary."""
    assert argv[0] == "servo-edge"
    summary = tmp_path / f"run-{argv[2]}.json"
    run = ["--duration", "4", "--summary", str(summary), "--no-status"]
    done = subprocess.run(
        [sys.executable, "-m", "servo.cli.edge", *argv[1:], *run],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, object] = json.loads(summary.read_text())
    assert result["final_state"] == "streaming", result
    assert isinstance(result["chunks_received"], int)
    assert result["chunks_received"] >= 2
    return result


@pytest.mark.slow
def test_an_so_arm_policy_at_15_fps_gets_an_arm_and_a_sim_command_that_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, port = serve(tmp_path, "cameras = {}\nchunk_size = 20\nfps = 15.0")
    emulator = FeetechEmulator().start()
    try:
        arm, sim = printed(server, "on the robot"), printed(server, "without hardware")
        assert arm == [
            "servo-edge",
            *("--robot", "so101", "--robot-opt", "port=PORT", "--robot-opt", "id=ARM"),
            *("--robot-opt", "fps=15", "--connect", f"tcp/127.0.0.1:{port}"),
        ]
        assert sim == ["servo-edge", "--robot", "sim", "--robot-opt", "fps=15", "--connect", f"tcp/127.0.0.1:{port}"]
        # The robot's computer: its bus, and its arm's calibration where LeRobot writes it.
        calibration = tmp_path / "calibration"
        write_calibration(calibration / "robots" / "so101_follower" / "my_arm.json")
        store_calibration(emulator, CALIBRATION)
        here = [arg.replace("PORT", emulator.port).replace("ARM", "my_arm") for arg in arm]
        # The emulated bus answers from a Python thread of this busy test process, not within the
        # millisecond of a servo on USB: it gets longer to answer (a run option, like --duration).
        here += ["--robot-opt", "timeout_s=0.5"]
        env = {**os.environ, "HF_LEROBOT_CALIBRATION": str(calibration)}
        driven = run_as_printed(here, tmp_path, env=env)
        assert driven["parked"] is True
        run_as_printed(sim, tmp_path)
    finally:
        emulator.close()
        server.stop()


@pytest.mark.slow
def test_a_7_joint_policy_with_its_own_camera_gets_a_sim_of_its_joints(tmp_path: Path) -> None:
    server, port = serve(tmp_path, f"cameras = {{laptop = [120, 160]}}\nchunk_size = 30\nfps = 15.0\n{names(7)}")
    try:
        assert printed(server, "on the robot") is None  # no arm servo knows has these joints
        sim = printed(server, "without hardware")
        assert sim == ["servo-edge", "--robot", "sim", "--robot-opt", "fps=15", "--connect", f"tcp/127.0.0.1:{port}"]
        recording = tmp_path / "ep.servo"
        run_as_printed([*sim, "--record", str(recording)], tmp_path)
    finally:
        server.stop()
    header = read_recording(recording).header
    assert header.joint_names == [f"joint_{i}.pos" for i in range(7)]
    assert header.fps == 15.0


@pytest.mark.slow
def test_a_slow_14_joint_policy_gets_the_buffer_its_plan_asks_for(tmp_path: Path) -> None:
    # A chunk of 37 steps at 15 fps lasts 2.47 s; a 520 ms forward outlasts the default 0.5 s buffer
    # (the buffer asked for follows the forward measured, at least 520 ms: 0.55 s or more).
    options = "cameras = {front = [240, 320], wrist = [120, 160]}\nchunk_size = 37\nfps = 15.0\n"
    server, _port = serve(tmp_path, options + f"compute_ms = 520\n{names(14)}")
    try:
        (warning,) = [line for line in server.lines if "warning: a forward" in line]
        assert "lower model.options.compute_ms (520 now)" in warning
        asked = re.search(r"run edges with --buffer-time-s (\S+) ", warning)
        assert asked is not None, warning
        assert float(asked.group(1)) > 0.5
        sim = printed(server, "without hardware")
        assert sim is not None
        assert sim[sim.index("--buffer-time-s") + 1] == asked.group(1)
        assert "fps=15" in sim
        run_as_printed(sim, tmp_path)
    finally:
        server.stop()


@pytest.mark.wildcard
@pytest.mark.slow
def test_a_lan_server_prints_a_sim_command_that_joins_from_a_fresh_robot(tmp_path: Path) -> None:
    # Off loopback the server asks for a join token; the sim, fitted to a 7-joint policy, must
    # reach the server it joins before the engine does (the token pins the certificate first).
    options = f"cameras = {{laptop = [120, 160]}}\nchunk_size = 30\n{names(7)}"
    server, _port = serve(tmp_path, options, listen="tls/0.0.0.0:{port}")
    try:
        sim = printed(server, "without hardware")
        assert sim is not None
        assert "--join" in sim
        assert "--tls-root-ca" not in sim  # nothing to copy by hand
        robot = tmp_path / "robot"
        robot.mkdir()
        fresh = {**os.environ, "SERVO_CONFIG_DIR": str(robot / "servo")}
        run_as_printed(sim, robot, env=fresh)
    finally:
        server.stop()
