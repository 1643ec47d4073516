"""``--robot ros2`` options: names, units and limits resolved once; every mistake one line naming the option."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from servo.config import ConfigError
from servo.robots import RobotDescription, robot_options
from servo.robots.ros2.options import Ros2Options, resolve, ros_name
from servo.robots.ros2.urdf import UrdfError, joint_limits

URDF = """<?xml version="1.0"?>
<robot name="arm">
  <link name="base"/><link name="l1"/><link name="l2"/><link name="l3"/><link name="l4"/>
  <joint name="joint_1" type="revolute"><parent link="base"/><child link="l1"/>
    <limit lower="-2.0" upper="2.5" velocity="1.5" effort="10"/></joint>
  <joint name="joint_2" type="prismatic"><parent link="l1"/><child link="l2"/>
    <limit lower="0.0" upper="0.04" velocity="0.1" effort="5"/></joint>
  <joint name="spin" type="continuous"><parent link="l2"/><child link="l3"/>
    <limit velocity="3.0" effort="1"/></joint>
  <joint name="camera_mount" type="fixed"><parent link="l3"/><child link="l4"/></joint>
</robot>
"""


@pytest.fixture
def urdf(tmp_path: Path) -> Path:
    path = tmp_path / "arm.urdf"
    path.write_text(URDF)
    return path


def options(**values: object) -> Ros2Options:
    base: dict[str, object] = {"joints": "pan=joint_1,grip=joint_2", "rest_pose": "0.5,0.02"}
    base.update(values)
    parsed = robot_options("ros2", {key: str(value) for key, value in base.items()})
    assert isinstance(parsed, Ros2Options)
    return parsed


def error(**values: object) -> str:
    with pytest.raises(ConfigError) as caught:
        options(**values)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_limits_from_the_urdf_in_the_policys_units(urdf: Path) -> None:
    setup = resolve(options(urdf=urdf, units="degrees,meters"))
    spec = setup.spec()
    assert spec.joint_names == ("pan", "grip")
    assert setup.robot_names == ("joint_1", "joint_2")
    assert spec.units == ("degrees", "meters")
    deg = 180 / math.pi
    assert spec.lower == pytest.approx((-2.0 * deg, 0.0))
    assert spec.upper == pytest.approx((2.5 * deg, 0.04))
    assert spec.max_velocity == pytest.approx((1.5 * deg, 0.1))
    assert spec.rest_pose == pytest.approx((0.5 * deg, 0.02))


def test_raw_values_pass_through_and_are_left_out_of_the_unit_check() -> None:
    limits = {"lower": "-1,0", "upper": "1,100", "max_velocity": "1,50"}
    setup = resolve(options(units="degrees,raw", rest_pose="0,50", **limits))
    assert setup.scale == pytest.approx((180 / math.pi, 1.0))
    spec = setup.spec()
    assert spec.units == ("degrees", "")
    assert (spec.upper[1], spec.rest_pose[1]) == (100.0, 50.0)


def test_options_override_the_urdf_and_a_continuous_joint_needs_a_range(urdf: Path) -> None:
    spec = resolve(options(urdf=urdf, max_velocity="0.5,0.05")).spec()
    assert spec.max_velocity == pytest.approx((0.5, 0.05))
    assert spec.lower == pytest.approx((-2.0, 0.0))
    assert "spin has no finite range (a continuous joint?)" in error(urdf=urdf, joints="spin", rest_pose="0")
    spec = resolve(options(urdf=urdf, joints="spin", rest_pose="0", lower="-3", upper="3")).spec()
    assert (spec.lower, spec.upper, spec.max_velocity) == ((-3.0,), (3.0,), (3.0,))


def test_joint_names_default_to_the_robots() -> None:
    setup = resolve(options(joints="a,b=c", rest_pose="0,0", lower="-1,-1", upper="1,1", max_velocity="1,1"))
    assert (setup.policy_names, setup.robot_names) == (("a", "b"), ("a", "c"))


def test_topics_resolve_like_a_ros_node_in_the_namespace() -> None:
    assert ros_name("joint_states", "", "state_topic") == "/joint_states"
    assert ros_name("joint_states", "/arm1", "state_topic") == "/arm1/joint_states"
    assert ros_name("/joint_states", "/arm1", "state_topic") == "/joint_states"  # absolute: as given
    assert ros_name("ctrl/commands", "arm1/", "command_topic") == "/arm1/ctrl/commands"


def test_the_domain_comes_from_ros_domain_id_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = {"lower": "-1,0", "upper": "1,1", "max_velocity": "1,1"}
    monkeypatch.setenv("ROS_DOMAIN_ID", "17")
    assert resolve(options(**limits)).domain_id == 17
    assert resolve(options(domain_id=3, **limits)).domain_id == 3
    monkeypatch.setenv("ROS_DOMAIN_ID", "300")
    assert "ROS_DOMAIN_ID='300' is not a domain id" in error(**limits)


def test_cameras_need_a_topic_and_a_size_and_compressed_topics_are_jpeg() -> None:
    limits = {"lower": "-1,0", "upper": "1,1", "max_velocity": "1,1"}
    setup = resolve(options(cameras="front:image_raw:64x48@15,wrist:/wrist/image/compressed:32x24", **limits))
    front, wrist = setup.cameras
    assert (front.topic, front.compressed, front.spec.height, front.spec.width, front.spec.fps) == (
        "/image_raw",
        False,
        48,
        64,
        15.0,
    )
    assert (wrist.topic, wrist.compressed) == ("/wrist/image/compressed", True)
    assert "camera 'front' needs a topic and a size" in error(cameras="front:image_raw", **limits)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, "robot 'ros2': urdf: servo needs every joint's limits: give urdf=FILE, or lower, upper, max_velocity"),
        ({"lower": "-1", "upper": "1,1", "max_velocity": "1,1"}, "lower = ['-1']: has 1 values, needs one per joint"),
        ({"joints": "a=x,b=x", "lower": "-1,-1", "upper": "1,1", "max_velocity": "1,1"}, "robot joint name(s) x"),
        ({"lower": "1,0", "upper": "1,1", "max_velocity": "1,1"}, "joint_1: lower 1.0 is not below upper 1.0"),
        ({"lower": "-1,0", "upper": "1,1", "max_velocity": "1,0"}, "joint_2: 0.0 is not a positive speed"),
        ({"lower": "-1,0", "upper": "1,1", "max_velocity": "1,1", "units": "furlongs"}, "units"),
        ({"lower": "-1,0", "upper": "1,1", "max_velocity": "1,1", "state_topic": "joint states"}, "state_topic"),
        ({"lower": "-1,0", "upper": "1,1", "max_velocity": "1,1", "command_joints": "joint_1"}, "command_joints"),
        ({"lower": "-1,0", "upper": "1,1", "max_velocity": "1,1", "domain_id": "233"}, "domain_id"),
        ({"lower": "-1,0", "upper": "1,1", "max_velocity": "1,1", "fps": "0"}, "fps"),
    ],
)
def test_mistakes_are_one_line_naming_the_option(values: dict[str, object], expected: str) -> None:
    assert expected in error(**values)


def test_urdf_errors_name_the_file_and_the_joint(urdf: Path, tmp_path: Path) -> None:
    assert joint_limits(urdf, ["joint_2"])["joint_2"].upper == 0.04
    with pytest.raises(UrdfError, match=r"has no joint 'knee' \(its joints: camera_mount, joint_1, joint_2, spin\)"):
        joint_limits(urdf, ["knee"])
    with pytest.raises(UrdfError, match="joint 'camera_mount' is fixed, not a revolute or prismatic joint"):
        joint_limits(urdf, ["camera_mount"])
    broken = tmp_path / "broken.urdf"
    broken.write_text("<robot><joint name='j' type='revolute'><limit lower='a' upper='1' velocity='1'/></joint>")
    with pytest.raises(UrdfError, match="is not XML"):
        joint_limits(broken, ["j"])
    broken.write_text(
        "<robot><joint name='j' type='revolute'><limit lower='nan' upper='1' velocity='1'/></joint></robot>"
    )
    with pytest.raises(UrdfError, match="lower='nan', not a finite number"):
        joint_limits(broken, ["j"])
    assert f"urdf = '{tmp_path}/missing.urdf': cannot read" in error(urdf=tmp_path / "missing.urdf")


def test_building_the_spec_opens_nothing() -> None:
    """The edge's main process builds the robot for its spec; without a driver that must just work."""
    robot = RobotDescription(
        "ros2", {"joints": "a", "rest_pose": "0", "lower": "-1", "upper": "1", "max_velocity": "1"}
    )
    spec = robot.spec()
    assert (spec.name, spec.joint_names, spec.units, spec.fps) == ("ros2", ("a",), ("radians",), 30.0)


LIMITED = "{'joints': 'a', 'rest_pose': '0', 'lower': '-1', 'upper': '1', 'max_velocity': '1'}"


def python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_cyclone_dds_is_loaded_only_for_a_ros2_robot() -> None:
    """The extra is optional: help, the other robots and the options never import it."""
    assert (
        python(
            "import sys; from servo.cli.edge import build_parser; from servo.robots import make_robot, robot_options; "
            "build_parser().format_help(); make_robot('sim', {'cameras': 'none'}); "
            f"robot_options('ros2', {LIMITED}); "
            "print('cyclonedds' in sys.modules)"
        )
        == "False"
    )
    assert python(
        "import sys; sys.modules['cyclonedds'] = None; from servo.robots import make_robot\n"
        f"try: make_robot('ros2', {LIMITED})\n"
        "except Exception as exc: print(type(exc).__name__, exc)"
    ).startswith("ConfigError robot 'ros2' needs Cyclone DDS: pip install 'servo-robotics[ros2]'")
