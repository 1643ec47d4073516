"""A robot plugin (``--robot package.module:factory``) as a user runs it: help, errors, and a run
whose joints are built by the plugin inside the control process."""

from __future__ import annotations

import json
from pathlib import Path

from tests.edge.harness import run_edge
from tests.edge.test_cli import error_lines, far_trajectory

TWIN = "tests.robots.plugin_arms:twin"


def test_a_plugin_drives_the_arm_from_the_control_process(tmp_path: Path) -> None:
    replay = far_trajectory(tmp_path / "far.servo")
    summary = tmp_path / "run.json"
    result = run_edge(f"--robot {TWIN} --robot-opt camera=true --replay {replay} --summary {summary}")
    assert result.returncode == 0, result.stderr
    run = json.loads(summary.read_text())
    assert run["control_loop"] == "ProcessControlLoop"
    assert run["ticks"] > 30
    assert run["parked"] is True
    assert run["stop_reason"] == "finished"


def test_robot_help_lists_a_plugins_options() -> None:
    result = run_edge(f"--robot {TWIN} --robot-help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"  --robot {TWIN}: A simulated arm under another name (a plugin with options and cameras).",
        "      fps (float, default 30.0): Control rate (Hz).",
        "      camera (bool, default False): Give it a 64x48 camera named 'eye'.",
    ]


def test_a_plugin_that_fails_is_one_line_and_exit_2() -> None:
    result = run_edge("--robot tests.robots.plugin_arms:fails --duration 1")
    assert result.returncode == 2
    (line,) = error_lines(result.stderr)
    assert line == (
        "servo-edge: error: robot 'tests.robots.plugin_arms:fails' failed to build: RuntimeError: "
        "the arm's driver library is missing"
    )
    assert "Traceback" not in result.stderr
    result = run_edge("--robot tests.robots.plugin_arms:twin --robot-opt speed=3 --robot-help")
    assert result.returncode == 0  # --robot-help ignores the options given
    result = run_edge("--robot tests.robots.plugin_arms:twin --robot-opt speed=3 --duration 1")
    (line,) = error_lines(result.stderr)
    assert line == ("servo-edge: error: robot 'tests.robots.plugin_arms:twin': speed: unknown key (valid: camera, fps)")


def test_an_so101_on_the_emulated_bus_refuses_another_arms_calibration_then_writes_it_when_asked(
    tmp_path: Path,
) -> None:
    """The real driver in the control process, on the pty-emulated Feetech bus."""
    from tests.robots.calib_data import CALIBRATION, write_calibration
    from tests.robots.feetech_emulator import ADDR_MIN_LIMIT, FeetechEmulator

    calibration = write_calibration(tmp_path / "calibration" / "robots" / "so101_follower" / "red_arm.json")
    replay = far_trajectory(tmp_path / "far.servo")
    emulator = FeetechEmulator().start()
    try:
        arm = f"--robot so101 --robot-opt port={emulator.port} --robot-opt calibration={calibration} "
        result = run_edge(f"{arm} --replay {replay} --log-level critical")
        assert result.returncode == 1, result.stderr
        (line,) = error_lines(result.stderr)
        assert line == (
            f"servo-edge: error: the control loop did not start: robot: SO-101 on {emulator.port}: motor "
            f"shoulder_pan (id 1) holds homing_offset 0, range 0..4095 (and 5 more motor(s)), but {calibration} "
            "says homing_offset -420, range 760..3340: if that file is this arm's, write it into the motors with "
            "--robot-opt write_calibration=true; otherwise give this arm's own id= or calibration="
        )
        assert emulator.writes == []

        summary = tmp_path / "run.json"
        result = run_edge(f"{arm} --robot-opt write_calibration=true --replay {replay} --summary {summary}")
        assert result.returncode == 0, result.stderr
        assert json.loads(summary.read_text())["parked"] is True
        assert emulator.get(3, ADDR_MIN_LIMIT) == CALIBRATION["elbow_flex"].range_min
    finally:
        emulator.close()
