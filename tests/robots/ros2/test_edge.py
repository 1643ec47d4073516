"""``servo-serve`` + ``servo-edge --robot ros2`` + the simulated ROS 2 arm in its own process, all
three talking as they would to a real robot (DDS on loopback, Zenoh on 127.0.0.1)."""

from __future__ import annotations

import json
import math
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servo.recording import EpisodeHeader, FrameRecord, RecordingWriter, read_recording
from servo.wire import decode_tensor, encode_tensor
from tests.edge.fakes import wait_for
from tests.edge.harness import Proc, edge_argv, run_edge, start_server, write_manifest
from tests.robots.ros2.node import LOWER, NODE_JOINTS, NODE_POSE, POLICY_JOINTS, REST, UPPER, RosEnv, received
from tests.support import free_port

DEG = 180.0 / math.pi
CAMERA = "front:cam/image_raw/compressed:64x48"
#: The reference policy with the policy's joint names (its motion prior is in degrees).
POLICY = (
    "cameras = {front = [48, 64]}\nchunk_size = 20\nfps = 30.0\n"
    f"joint_names = [{', '.join(repr(name) for name in POLICY_JOINTS)}]"
).replace("'", '"')


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    port = free_port()
    proc = start_server(write_manifest(tmp_path_factory.mktemp("ros2") / "manifest.toml", port, options=POLICY))
    try:
        yield port
    finally:
        proc.stop()


def to_policy(target: dict[str, Any]) -> np.ndarray:
    """A target the arm received (its names, rad) in the policy's order and units (degrees)."""
    by_name = dict(zip(target["names"], target["positions"], strict=True))
    return np.array([by_name[theirs] * DEG for theirs in POLICY_JOINTS.values()])


def edge(env: RosEnv, port: int, tail: str) -> str:
    """A ``servo-edge`` command line driving the simulated arm with the server's policy."""
    return f"{env.robot_flags(units='degrees', cameras=CAMERA)} --connect tcp/127.0.0.1:{port} {tail}"


@pytest.mark.parametrize("transport", ["dds", "zenoh"])
def test_the_policys_targets_reach_the_arms_joints_in_order_and_within_limits(
    server: int, request: pytest.FixtureRequest, tmp_path: Path, transport: str
) -> None:
    ros_env: RosEnv = request.getfixturevalue("ros_env" if transport == "dds" else "zenoh_env")
    record, summary, episode = tmp_path / "received.jsonl", tmp_path / "run.json", tmp_path / "ep.servo"
    node = ros_env.start_node("--camera", CAMERA, record=record)
    try:
        result = run_edge(edge(ros_env, server, f"--duration 4 --summary {summary} --record {episode}"), timeout=90)
    finally:
        node.stop()
    assert result.returncode == 0, result.stdout + result.stderr
    run = json.loads(summary.read_text())
    assert (run["final_state"], run["parked"], run["fault"]) == ("streaming", True, "")
    assert run["control_loop"] == "ProcessControlLoop"
    assert run["actions_executed"] > 30
    assert run["records_dropped"] == 0

    rec = read_recording(episode)
    assert rec.header.joint_names == list(POLICY_JOINTS)
    # The first state is the arm's start pose, each joint by its name, in degrees.
    start = dict(zip(NODE_JOINTS, NODE_POSE, strict=True))
    np.testing.assert_allclose(rec.states()[0], [start[j] * DEG for j in POLICY_JOINTS.values()], atol=1e-3)
    sent = [
        np.asarray(decode_tensor(f.action, dtype="float32"), np.float64) for f in rec.frames if f.action is not None
    ]
    got = [to_policy(target) for target in received(record)]
    # Every target the arm received was sent, in the order it was sent (none invented or reordered)...
    index = 0
    for target in got:
        while index < len(sent) and not np.allclose(sent[index], target, atol=1e-3):
            index += 1
        assert index < len(sent), f"received {target}, which was not sent after the previous one"
        index += 1
    # ...nearly all of them arrived, the newest always does (reliable), and it is the rest pose.
    assert len(got) >= 0.8 * len(sent)
    np.testing.assert_allclose(got[-1], sent[-1], atol=1e-3)
    np.testing.assert_allclose(got[-1], np.asarray(REST) * DEG, atol=1e-3)
    rad = np.array(got) / DEG
    assert np.all(rad >= np.asarray(LOWER) - 1e-9)
    assert np.all(rad <= np.asarray(UPPER) + 1e-9)
    assert np.ptp(rad[:, 0]) > 0.05  # the policy did move the arm


def test_a_killed_driver_is_a_fault_and_the_edge_exits_3_without_moving(
    server: int, ros_env: RosEnv, tmp_path: Path
) -> None:
    summary = tmp_path / "run.json"
    node = ros_env.start_node("--camera", CAMERA)
    proc = Proc(edge_argv(edge(ros_env, server, f"--duration 60 --summary {summary}")))
    try:
        proc.wait_line("control loop running", 60)
        node.kill()
        killed = time.monotonic()
        code = proc.wait(60)
        took = time.monotonic() - killed
    finally:
        proc.kill()
        node.kill()
    assert code == 3, proc.output
    run = json.loads(summary.read_text())
    assert run["final_state"] == "dead"
    assert run["parked"] is False  # nobody to park: no state came back within the park timeout
    assert run["fault"].startswith("robot: joint states stopped arriving")
    assert "Traceback" not in proc.output
    assert took < 0.5 + 5.0 + 10.0  # state_timeout_s + the park timeout, with room for a loaded machine


def test_a_driver_that_hangs_then_recovers_is_parked_before_the_edge_exits_3(
    server: int, ros_env: RosEnv, tmp_path: Path
) -> None:
    record, summary = tmp_path / "received.jsonl", tmp_path / "run.json"
    node = ros_env.start_node("--camera", CAMERA, record=record)
    proc = Proc(edge_argv(edge(ros_env, server, f"--duration 60 --summary {summary}")))
    try:
        proc.wait_line("control loop running", 60)
        wait_for(lambda: record.exists() and len(received(record)) >= 10, 20, "the policy's targets")
        node.popen.send_signal(signal.SIGSTOP)  # the driver hangs: no state, no ack of targets
        proc.wait_line("joint states stopped arriving", 20)
        node.popen.send_signal(signal.SIGCONT)
        code = proc.wait(60)
    finally:
        proc.kill()
        node.popen.send_signal(signal.SIGCONT)
        node.stop()
    assert code == 3, proc.output
    run = json.loads(summary.read_text())
    assert (run["final_state"], run["parked"]) == ("dead", True)
    assert run["fault"].startswith("robot: joint states stopped arriving")
    np.testing.assert_allclose(to_policy(received(record)[-1]), np.asarray(REST) * DEG, atol=1e-3)


def trajectory(path: Path) -> Path:
    """A replay of the rest pose with the policy's joints (no server needed to reach the robot's start)."""
    rest = np.asarray(REST, np.float32) * np.float32(DEG)
    writer = RecordingWriter(path, EpisodeHeader(robot="ros2", fps=30.0, joint_names=list(POLICY_JOINTS)))
    for i in range(30):
        writer.write(FrameRecord(i, i, encode_tensor(rest), encode_tensor(rest), "replay"))
    writer.close()
    return path


@pytest.mark.parametrize(
    ("node_args", "robot_opt", "expected"),
    [
        (
            ["--command-type", "std_msgs/Float64MultiArray"],
            "",
            "{ns}/target_joints is subscribed to as std_msgs/msg/Float64MultiArray, not sensor_msgs/msg/JointState "
            "(check command_type)",
        ),
        (
            [],
            "--robot-opt joints=pan=shoulder_pan_joint,lift=shoulder_lift_joint,elbow=knee_joint,wrist=wrist_joint,"
            "grip=gripper_joint --robot-opt connect_timeout_s=3",
            "{ns}/joint_states has no joint knee_joint within 3 s (it has wrist_joint, elbow_joint, head_pan, "
            "shoulder_lift_joint, shoulder_pan_joint, gripper_joint); check joints",
        ),
    ],
)
def test_a_wrong_message_type_or_a_missing_joint_is_one_line_at_start(
    ros_env: RosEnv, tmp_path: Path, node_args: list[str], robot_opt: str, expected: str
) -> None:
    replay = trajectory(tmp_path / "rest.servo")
    node = ros_env.start_node(*node_args)
    try:
        result = run_edge(f"{ros_env.robot_flags(units='degrees')} {robot_opt} --replay {replay}", timeout=90)
    finally:
        node.stop()
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("servo-edge: error:")]
    assert lines == [
        "servo-edge: error: the control loop did not start: robot: ROS 2 robot: "
        + expected.format(ns=ros_env.namespace)
    ]
    assert "Traceback" not in result.stderr
