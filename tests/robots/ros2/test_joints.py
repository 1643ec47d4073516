"""`Ros2Joints` against the simulated ROS 2 arm in its own process, over Cyclone DDS on loopback."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

from servo.config import ConfigError
from servo.robots import RobotDescription
from servo.robots.ros2.joints import Ros2Joints
from tests.edge.fakes import wait_for
from tests.robots.ros2.node import NODE_JOINTS, NODE_POSE, POLICY_JOINTS, REST, RosEnv, first_fault, received

DEG = 180.0 / math.pi


def joints_of(env: RosEnv, **options: object) -> Ros2Joints:
    robot = RobotDescription("ros2", env.robot_options(**options)).build()
    assert isinstance(robot, Ros2Joints)
    return robot


def expected_state(scale: float = 1.0) -> np.ndarray:
    by_name = dict(zip(NODE_JOINTS, NODE_POSE, strict=True))
    return np.array([by_name[theirs] * scale for theirs in POLICY_JOINTS.values()], np.float32)


@pytest.mark.parametrize(
    "command_type", ["sensor_msgs/JointState", "std_msgs/Float64MultiArray", "trajectory_msgs/JointTrajectory"]
)
def test_states_by_name_and_targets_mapped_to_the_arms_joints(
    ros_env: RosEnv, tmp_path: Path, command_type: str
) -> None:
    record = tmp_path / "received.jsonl"
    command_joints = ",".join(reversed(POLICY_JOINTS.values()))
    node_args = ["--command-type", command_type]
    options: dict[str, object] = {"command_type": command_type, "units": "degrees"}
    if command_type == "std_msgs/Float64MultiArray":
        # A forward controller takes its values in its own joint order.
        node_args += ["--command-joints", command_joints]
        options["command_joints"] = command_joints
    node = ros_env.start_node(*node_args, record=record)
    robot = joints_of(ros_env, **options)
    try:
        robot.connect()
        np.testing.assert_allclose(robot.read_state(), expected_state(DEG), atol=1e-3)
        target = np.array([10.0, -20.0, 30.0, -40.0, 50.0], np.float32)  # degrees, policy order
        robot.send_action(target)
        wait_for(lambda: record.exists() and received(record), 10, "the target to arrive")
    finally:
        robot.disconnect()
        node.stop()
    first = received(record)[0]
    got = dict(zip(first["names"], first["positions"], strict=True))
    assert set(got) == set(POLICY_JOINTS.values())
    for value, theirs in zip(target, POLICY_JOINTS.values(), strict=True):
        assert got[theirs] == pytest.approx(value / DEG, abs=1e-6)


def test_a_killed_driver_is_a_robot_fault_within_the_bound(ros_env: RosEnv) -> None:
    node = ros_env.start_node()
    robot = joints_of(ros_env, state_timeout_s=0.3)
    try:
        robot.connect()
        still = robot.read_state()
        robot.send_action(np.array(REST, np.float32))  # the arm moves: every state it publishes is new
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            fresh = time.monotonic()
            if not np.array_equal(robot.read_state(), still):
                break  # this read took a state published after the command, at or after `fresh`
            time.sleep(0.005)
        else:
            raise AssertionError("the arm did not move within 10 s")
        node.kill()
        _, message = first_fault(robot)
        faulted = time.monotonic()
    finally:
        robot.disconnect()
    # Not before the bound, counted from that fresh state (a loaded machine may hold back the
    # driver's last states before the kill, so the kill itself is no reference).
    assert faulted - fresh > 0.3
    assert "joint states stopped arriving" in message


def test_a_joint_the_arm_does_not_have_is_one_line_at_connect(ros_env: RosEnv) -> None:
    node = ros_env.start_node()
    joints = ",".join(f"{mine}={theirs}" for mine, theirs in POLICY_JOINTS.items()).replace("elbow_joint", "knee")
    robot = joints_of(ros_env, joints=joints, connect_timeout_s=2)
    try:
        with pytest.raises(ConnectionError) as caught:
            robot.connect()
    finally:
        node.stop()
    message = str(caught.value)
    assert "\n" not in message
    assert f"{ros_env.namespace}/joint_states has no joint knee" in message
    assert "shoulder_pan_joint" in message  # what the arm does publish, to fix the mapping with


@pytest.mark.parametrize("env", ["ros_env", "zenoh_env"])
def test_a_target_subscriber_of_another_type_is_one_line_at_connect(request: pytest.FixtureRequest, env: str) -> None:
    """DDS says it through its built-in topics, rmw_zenoh through the graph's liveliness tokens."""
    ros_env: RosEnv = request.getfixturevalue(env)
    node = ros_env.start_node("--command-type", "std_msgs/Float64MultiArray")
    robot = joints_of(ros_env, command_type="sensor_msgs/JointState")
    started = time.monotonic()
    try:
        with pytest.raises(ConnectionError) as caught:
            robot.connect()
    finally:
        node.stop()
    assert str(caught.value) == (
        f"ROS 2 robot: {ros_env.namespace}/target_joints is subscribed to as std_msgs/msg/Float64MultiArray, "
        "not sensor_msgs/msg/JointState (check command_type)"
    )
    assert time.monotonic() - started < 20  # said as soon as it was seen, not at connect_timeout_s


def test_no_driver_at_all_says_where_it_looked(ros_env: RosEnv) -> None:
    robot = joints_of(ros_env, connect_timeout_s=0.5)
    with pytest.raises(ConnectionError, match=rf"no sensor_msgs/JointState on {ros_env.namespace}/joint_states within"):
        robot.connect()
    robot.disconnect()


def test_the_options_are_checked_before_anything_opens(ros_env: RosEnv) -> None:
    with pytest.raises(ConfigError, match=r"robot 'ros2': rest_pose = .*outside shoulder_pan_joint's limits"):
        RobotDescription("ros2", ros_env.robot_options(rest_pose="9,0,0,0,0.5")).build()
