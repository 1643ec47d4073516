"""The "From LeRobot" guide, run as written: a checkpoint folder to the sim arm moving under its chunks.

The commands are read from docs/guides/lerobot.md, so this fails when the guide drifts from what works. Only
what a test machine must change is changed: a free port for 7447, 127.0.0.1 for the GPU box's
addresses, the CPU for ``--device cuda``, and the join token this server printed for the guide's.
The checkpoint is a tiny random ACT written where the guide's command looks for it, with LeRobot's
own writers, beside the metadata of its training dataset; the robot runs with a servo directory of
its own (a fresh machine: nothing copied to it).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lerobot", minversion="0.5", reason="needs servo-robotics[lerobot] (Python >= 3.12)")

from servo.cli.edge import build_parser, robot_option_values
from servo.cli.flags import struct_flag_values
from servo.edge.config import EdgeConfig, load_edge_config
from servo.home import CONFIG_DIR_VARIABLE
from servo.recording import read_recording
from servo.robots import RobotDescription
from tests.edge.harness import Proc
from tests.guides import command, commands, guide, option, program, with_token, without_asked_buffer
from tests.lerobot.checkpoints import SO101_JOINTS, build_trained_act
from tests.robots.calib_data import write_calibration
from tests.support import free_port

#: What the checkpoint is trained on: LeRobot's usual SO-101 cameras (the sim arm's too), at 30 fps.
CAMERAS = ("front", "wrist")
REPO_ID, DATASET_ROOT, FPS = "local/so101_try", "data/so101_try", 30


def on_this_machine(argv: list[str], port: int, server: str = "127.0.0.1") -> list[str]:
    """A guide's command with what a test machine must change: port, the GPU box's address, device.

    The server keeps its ``tls/0.0.0.0`` listen: that is what makes it ask robots for a join token.
    """
    out = []
    for arg in argv:
        arg = arg.replace("gpu-box", server).replace(":7447", f":{port}")
        out.append("cpu" if out and out[-1] == "--device" else arg)
    return out


@pytest.mark.wildcard
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_from_checkpoint_to_the_sim_arm_as_the_guide_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = commands(guide("lerobot"))
    serve = command(found, "servo-serve", "--lerobot")
    arm, sim = command(found, "servo-edge", "--robot", "so101"), command(found, "servo-edge", "--robot", "sim")
    port = free_port()
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "lerobot_home"))  # no dataset of this machine's
    monkeypatch.setenv("HF_LEROBOT_CALIBRATION", str(tmp_path / "calibration"))

    # The GPU box: the checkpoint where the guide looks for it, trained on a dataset on this machine.
    gpu_box = tmp_path / "gpu-box"
    checkpoint = gpu_box / option(serve, "--lerobot")
    build_trained_act(checkpoint, gpu_box / DATASET_ROOT, repo_id=REPO_ID, cameras=CAMERAS, fps=FPS)
    server = Proc(program(on_this_machine(serve, port)), cwd=gpu_box)
    try:
        server.wait_line("servo-serve: ready", 300)
        said = server.output
        # Everything the robot needs came from the checkpoint and its dataset, and says so.
        assert f"fps {FPS} and names from dataset {REPO_ID}" in said
        assert f"cameras: {', '.join(CAMERAS)}" in said
        assert "capacity: one replica carries" in said
        assert "TLS with the self-signed certificate" in said
        printed_sim = shlex.split(server.wait_line("servo-serve: without hardware: ", 1).split(": ", 2)[2])
        printed_arm = shlex.split(server.wait_line("servo-serve: on the robot: ", 1).split(": ", 2)[2])
        printed_sim, printed_arm = without_asked_buffer(printed_sim), without_asked_buffer(printed_arm)

        assert "the join token pins it" in said
        token = option(printed_sim, "--join")
        assert option(printed_arm, "--join") == token
        robot = tmp_path / "robot"
        robot.mkdir()
        robot_env = {**os.environ, CONFIG_DIR_VARIABLE: str(robot / "servo")}  # a fresh machine

        address = option(printed_sim, "--connect").removeprefix("tls/").rsplit(":", 1)[0]  # this host's, as printed
        # What servo-serve prints for the sim is the guide's command (less the try's run options).
        sim_here = with_token(on_this_machine(sim, port, address), token)
        assert sim_here[: len(printed_sim)] == printed_sim
        # ... and for the arm, the same flags with the guide's values in place of its placeholders.
        arm_here = with_token(on_this_machine(arm, port, address), token)
        for flag in ("--robot", "--connect", "--join"):
            assert option(arm_here, flag) == option(printed_arm, flag)
        monkeypatch.chdir(robot)
        arm_id = robot_option_values(build_parser().parse_args(arm_here[1:]).robot_opt)["id"]
        write_calibration(tmp_path / "calibration" / "robots" / "so101_follower" / f"{arm_id}.json")
        check_arm_command(arm_here, printed_arm)

        edge = subprocess.run(
            program(sim_here), cwd=robot, env=robot_env, capture_output=True, text=True, timeout=180, check=False
        )
    finally:
        server.stop()
    assert edge.returncode == 0, edge.stderr[-3000:]
    assert "servo-serve: stopped" in server.output

    summary = json.loads((robot / option(sim, "--summary")).read_text())
    assert summary["final_state"] == "streaming"
    assert summary["chunks_received"] >= 2
    recording = read_recording(robot / option(sim, "--record"))
    driven = [i for i, frame in enumerate(recording.frames) if frame.source == "policy"]
    assert len(driven) > 30
    assert all(recording.frames[i].provenance is not None for i in driven)
    states = recording.states()[driven]
    # The arm moved under the checkpoint's chunks: some joint travelled more than 2 degrees.
    assert float(np.ptp(states, axis=0).max()) > 2.0


def check_arm_command(argv: list[str], printed: list[str]) -> None:
    """The guide's SO-101 command parses as servo-edge parses it, for a robot the checkpoint accepts."""
    args = build_parser().parse_args(argv[1:])
    config = load_edge_config(None, struct_flag_values(args, EdgeConfig))
    assert config.security.join == option(printed, "--join")
    spec = RobotDescription(args.robot, robot_option_values(args.robot_opt)).spec()
    printed_cameras = robot_option_values(build_parser().parse_args(printed[1:]).robot_opt)["cameras"]
    assert [entry.split(":")[0] for entry in printed_cameras.split(",")] == list(CAMERAS)
    assert list(spec.cameras) == list(CAMERAS)  # named as the checkpoint's cameras
    assert list(spec.joint_names) == SO101_JOINTS
