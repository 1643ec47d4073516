"""The ROS 2 guide, run as written: examples/ros2's policy driving the simulated ROS 2 arm.

The commands are read from docs/guides/ros2.md: the server on examples/ros2/manifest.toml, the robot's
command (which must be the one the server prints for the arm, and the one the launch file runs)
and the simulated arm. Only what a test machine must change is changed: a free port for 7447,
127.0.0.1 for the server's addresses; the ROS domain (``ROS_DOMAIN_ID``, as on a robot's computer)
is the test's own, on loopback DDS (`tests.robots.ros2.fixtures`).
"""

from __future__ import annotations

import ast
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from servo.home import CONFIG_DIR_VARIABLE
from servo.recording import read_recording
from servo.robots.so100_joints import JOINT_NAMES
from tests.edge.harness import Proc
from tests.guides import REPO, command, commands, guide, option, program, with_token, without_asked_buffer
from tests.robots.ros2.node import RosEnv
from tests.support import free_port

LAUNCH = REPO / "examples" / "ros2" / "servo_edge.launch.py"


def on_this_machine(argv: list[str], port: int, server: str = "127.0.0.1") -> list[str]:
    """A guide's command with what a test machine must change: the port and the server's address.

    The server keeps its ``tls/0.0.0.0`` listen: that is what makes it ask robots for a join token.
    """
    here = {"gpu-server": server, ":7447": f":{port}"}
    out = []
    for arg in argv:
        for theirs, ours in here.items():
            arg = arg.replace(theirs, ours)
        out.append(arg)
    return out


def launched_edge() -> list[str]:
    """The command the launch file starts (its ``EDGE``), read without ROS's launch package."""
    tree = ast.parse(LAUNCH.read_text())
    (edge,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EDGE" for t in node.targets)
    ]
    return shlex.split(ast.literal_eval(edge))


@pytest.mark.wildcard
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_example_arm_as_the_guide_says(ros_env: RosEnv, tmp_path: Path) -> None:
    found = commands(guide("ros2"))
    serve = command(found, "servo-serve", "examples/ros2/manifest.toml")
    edge = command(found, "servo-edge", "--robot", "ros2")
    arm = command(found, "python", "-m", "servo.robots.ros2.sim_node")
    # The launch file runs the guide's command (without the status line a launch log cannot show).
    assert launched_edge() == [*edge, "--no-status"]

    port = free_port()
    env = {**os.environ, "ROS_DOMAIN_ID": str(ros_env.domain_id)}  # the robot's computer's domain
    node = Proc(program(arm), env=env)
    server = Proc(program(on_this_machine(serve, port)), cwd=REPO)
    try:
        node.wait_line("READY", 60)
        server.wait_line("servo-serve: ready", 180)
        printed = shlex.split(server.wait_line("servo-serve: on the robot: ", 1).split(": ", 2)[2])
        # What servo-serve prints for the arm is the guide's command, with the join token it made.
        token = option(printed, "--join")
        address = option(printed, "--connect").removeprefix("tls/").rsplit(":", 1)[0]  # this host's, as printed
        assert without_asked_buffer(printed) == with_token(on_this_machine(edge, port, address), token)

        # The robot's computer (a fresh servo directory: the token brings the server's identity and
        # certificate), the arm's URDF where the command names it.
        robot = tmp_path / "robot"
        env[CONFIG_DIR_VARIABLE] = str(robot / "servo")
        urdf = robot / next(a.split("=", 1)[1] for a in edge if a.startswith("urdf="))
        urdf.parent.mkdir(parents=True)
        shutil.copy(REPO / "examples" / "ros2" / "arm.urdf", urdf)
        summary, episode = robot / "run.json", robot / "ep.servo"
        run = ["--duration", "5", "--summary", str(summary), "--record", str(episode), "--no-status"]
        done = subprocess.run(
            [*program(printed), *run], cwd=robot, env=env, capture_output=True, text=True, timeout=180, check=False
        )
    finally:
        server.stop()
        node.stop()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(summary.read_text())
    assert (result["final_state"], result["parked"], result["fault"]) == ("streaming", True, "")
    assert result["chunks_received"] >= 2
    recording = read_recording(episode)
    assert recording.header.joint_names == list(JOINT_NAMES)
    driven = [i for i, frame in enumerate(recording.frames) if frame.source == "policy"]
    assert len(driven) > 30
    # The arm moved under the policy: some joint travelled more than 2 degrees.
    assert float(np.ptp(recording.states()[driven], axis=0).max()) > 2.0
