"""rmw_zenoh's transport: key expressions, attachments and graph tokens exactly as its design
document (ros2/rmw_zenoh docs/design.md) gives them, and the joints and cameras on it end to end."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from rosbags.typesys import Stores, get_typestore

from servo.robots import RobotDescription
from servo.robots.ros2 import messages as m
from servo.robots.ros2.joints import Ros2Joints
from servo.robots.ros2.rmw_zenoh import attachment, entity_token, key_expr, topic_key
from tests.edge.fakes import wait_for
from tests.robots.ros2.node import NODE_JOINTS, NODE_POSE, POLICY_JOINTS, NoPoses, RosEnv, first_fault, received

STRING = "std_msgs::msg::dds_::String_"
#: design.md prints this hash of std_msgs/String in its examples.
STRING_HASH = "RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18"


@pytest.mark.parametrize("store", [Stores.ROS2_JAZZY, Stores.ROS2_KILTED, Stores.LATEST])
def test_type_hashes_are_rep_2016s_as_rosbags_computes_them(store: Stores) -> None:
    types = get_typestore(store)
    assert types.hash_rihs01("std_msgs/msg/String") == STRING_HASH  # the algorithm design.md's examples show
    for kind in (m.JointState, m.Float64MultiArray, m.JointTrajectory, m.Image, m.CompressedImage):
        ros_name = kind.__idl_typename__.replace("::msg::dds_::", "/msg/").removesuffix("_")
        assert m.TYPE_HASHES[kind.__idl_typename__] == types.hash_rihs01(ros_name)


def test_key_expressions_of_the_design_documents_examples() -> None:
    assert key_expr(0, "/chatter", STRING, STRING_HASH) == f"0/chatter/{STRING}/{STRING_HASH}"
    assert key_expr(0, "/robot1/chatter", STRING, STRING_HASH) == f"0/robot1/chatter/{STRING}/{STRING_HASH}"
    add = "example_interfaces::srv::dds_::AddTwoInts_"
    add_hash = "RIHS01_e118de6bf5eeb66a2491b5bda11202e7b68f198d6f67922cf30364858239c81a"
    assert key_expr(2, "/add_two_ints", add, add_hash) == f"2/add_two_ints/{add}/{add_hash}"
    assert topic_key(7, "/arm1/joint_states", m.JointState) == (
        "7/arm1/joint_states/sensor_msgs::msg::dds_::JointState_/"
        "RIHS01_a13ee3a330e346c9d87b5aa18d24e11690752bd33a0350f11c5882bc9179260e"
    )


def test_liveliness_tokens_of_the_design_documents_examples() -> None:
    talker = entity_token(
        2, "8b20917502ee955ac4476e0266340d5c", 10, "MP", "/talker", f"/chatter:{STRING}", STRING_HASH, "::,7:,:,:,,"
    )
    assert talker == (
        f"@ros2_lv/2/8b20917502ee955ac4476e0266340d5c/0/10/MP/%/%/talker/%chatter/{STRING}/{STRING_HASH}/::,7:,:,:,,"
    )
    listener = entity_token(
        2, "aac3178e146ba6f1fc6e6a4085e77f21", 10, "MS", "/listener", f"/chatter:{STRING}", STRING_HASH, "::,10:,:,:,,"
    )
    assert listener == (
        f"@ros2_lv/2/aac3178e146ba6f1fc6e6a4085e77f21/0/10/MS/%/%/listener/%chatter/{STRING}/{STRING_HASH}/::,10:,:,:,,"
    )


def test_the_attachment_is_sequence_timestamp_gid_length_and_gid() -> None:
    gid = bytes(range(16))
    raw = attachment(0x0102030405060708, 1_700_000_000_123_456_789, gid)
    assert len(raw) == 8 + 8 + 1 + 16
    assert raw[:8] == bytes.fromhex("0807060504030201")  # int64, little-endian
    assert struct.unpack("<q", raw[8:16]) == (1_700_000_000_123_456_789,)  # ns since the UNIX epoch
    assert raw[16] == 16
    assert raw[17:] == gid


def test_joints_and_targets_over_rmw_zenoh(zenoh_env: RosEnv, tmp_path: Path) -> None:
    record = tmp_path / "received.jsonl"
    node = zenoh_env.start_node("--command-type", "trajectory_msgs/JointTrajectory", record=record)
    robot = RobotDescription(
        "ros2", zenoh_env.robot_options(command_type="trajectory_msgs/JointTrajectory", state_timeout_s=0.3)
    ).build()
    assert isinstance(robot, Ros2Joints)
    try:
        robot.connect()
        by_name = dict(zip(NODE_JOINTS, NODE_POSE, strict=True))
        expected = [by_name[theirs] for theirs in POLICY_JOINTS.values()]
        np.testing.assert_allclose(robot.read_state(), expected, atol=1e-6)
        robot.send_action(np.array([0.1, 0.2, 0.3, 0.4, 0.5], np.float32))
        wait_for(lambda: record.exists() and received(record), 10, "the target to arrive")
        first = received(record)[0]
        assert dict(zip(first["names"], first["positions"], strict=True)) == pytest.approx(
            dict(zip(POLICY_JOINTS.values(), [0.1, 0.2, 0.3, 0.4, 0.5], strict=True)), abs=1e-6
        )
        node.kill()
        assert "joint states stopped arriving" in first_fault(robot)[1]
    finally:
        robot.disconnect()
        node.kill()


def test_camera_frames_over_rmw_zenoh(zenoh_env: RosEnv) -> None:
    node = zenoh_env.start_node("--camera", "front:cam/image_raw/compressed:64x48")
    try:
        description = RobotDescription("ros2", zenoh_env.robot_options(cameras="front:cam/image_raw/compressed:64x48"))
        cameras = description.build_cameras(NoPoses())
        cameras.connect()
        try:
            frame = cameras.read_cameras()["front"]
        finally:
            cameras.disconnect()
    finally:
        node.stop()
    assert frame.shape == (48, 64, 3)
    assert frame[:, -8:, 0].mean() > frame[:, :8, 0].mean() + 20
