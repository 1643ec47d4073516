from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from servo.config import ConfigError
from servo.robots import (
    ROBOTS,
    NoCameras,
    Robot,
    RobotDescription,
    SimCameras,
    SimSO100,
    SOFollower,
    make_robot,
    options_help,
    robot_summary,
)
from servo.robots.calibration import CalibrationError
from servo.robots.camera_list import CameraEntry, parse_cameras
from tests.robots.calib_data import write_calibration


def test_table_lists_the_robots_with_documented_options() -> None:
    assert set(ROBOTS) == {"sim", "so100", "so101", "ros2"}
    so100 = options_help("so100")
    assert so100[0].startswith("port (str, required): Serial port")
    assert options_help("so101") == so100
    assert robot_summary("so101") == "Real SO-101 follower arm (Feetech STS3215 bus, LeRobot calibration)."
    # every option of every robot has a sentence of help (it is what --help shows)
    for name in ROBOTS:
        assert all(line.split(": ", 1)[1] for line in options_help(name))
    assert not any(line.startswith(("width", "height")) for line in options_help("sim"))


def test_unknown_robot_lists_valid_types() -> None:
    valid = "ros2, sim, so100, so101, or package.module:factory"
    with pytest.raises(ConfigError, match=rf"^unknown robot type 'so102'; valid types: {valid}"):
        make_robot("so102")


def test_unknown_option_is_named_with_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"robot 'sim': prot: unknown key") as info:
        make_robot("sim", {"prot": "/dev/ttyACM0"})
    assert "valid: cameras, fps, initial_pose, joints, noise_std" in str(info.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"fps": "fast"}, "fps = 'fast': expected float, got str"),
        ({"fps": -3}, "fps = -3: expected float > 0.0"),
        ({"seed": True}, "seed = True: expected int, got bool"),
        ({"realtime": "maybe"}, "realtime = 'maybe': expected bool"),
        ({"cameras": "front:/dev/video0"}, "cameras = 'front:/dev/video0': simulated camera 'front' takes no device"),
        ({"initial_pose": "1,2,x"}, "initial_pose[2] = 'x': expected float"),
        ({"initial_pose": "1,2,3"}, "initial_pose = ['1', '2', '3']: needs 6 values, one per joint"),
    ],
)
def test_invalid_values_name_the_option(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_robot("sim", options)
    assert str(info.value).startswith(f"robot 'sim': {message}")


def test_sim_from_cli_strings() -> None:
    robot = make_robot(
        "sim",
        {
            "fps": "50",
            "cameras": "front:320x240@15,top",
            "noise_std": "0.1",
            "seed": "3",
            "realtime": "false",
            "time_constant_s": 0.05,
        },
    )
    assert isinstance(robot, SimSO100)
    assert isinstance(robot, Robot)
    assert robot.spec.fps == 50.0
    front, top = robot.spec.cameras["front"], robot.spec.cameras["top"]
    assert (front.width, front.height, front.fps) == (320, 240, 15.0)
    assert (top.width, top.height, top.fps) == (640, 480, 30.0)
    assert robot.config.realtime is False
    assert make_robot("sim", {"cameras": "none"}).spec.cameras == {}


def test_driver_refusals_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"robot 'sim': .*initial_pose is outside the joint limits"):
        make_robot("sim", {"initial_pose": "1000,0,0,0,0,0"})


def test_so100_from_flat_options(tmp_path: Path) -> None:
    calibration = write_calibration(tmp_path / "arm.json")
    robot = make_robot(
        "so100",
        {
            "port": "/dev/ttyACM0",
            "calibration": str(calibration),
            "cameras": "front:0:640x480@30,wrist:/dev/video2:320x240",
            "max_relative_target": "10",
            "use_degrees": "true",
        },
    )
    assert isinstance(robot, SOFollower)
    assert not robot.is_connected
    assert robot.config.max_relative_target == 10.0
    cams = robot.config.cameras
    assert (cams["front"].index_or_path, cams["front"].width, cams["front"].fps) == (0, 640, 30.0)
    assert (cams["wrist"].index_or_path, cams["wrist"].height) == ("/dev/video2", 240)
    assert robot.spec.extra["calibration"] == str(calibration)


def test_so100_needs_port_and_one_calibration_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"robot 'so100': port: required key is missing"):
        make_robot("so100", {"calibration": "x.json"})
    with pytest.raises(ConfigError, match="give exactly one of calibration or id"):
        make_robot("so100", {"port": "/dev/ttyACM0"})
    with pytest.raises(CalibrationError, match=r"missing\.json does not exist"):
        make_robot("so100", {"port": "/dev/ttyACM0", "calibration": str(tmp_path / "missing.json")})


def test_so100_finds_lerobot_calibration_by_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_LEROBOT_CALIBRATION", str(tmp_path))
    path = write_calibration(tmp_path / "robots" / "so100_follower" / "blue_arm.json")
    robot = make_robot("so100", {"port": "/dev/ttyACM0", "id": "blue_arm"})
    assert isinstance(robot, SOFollower)
    assert robot.calibration_path == path
    assert robot.spec.name == "so100"


@pytest.mark.parametrize("kind", ["so101_follower", "so_follower"])
def test_so101_finds_lerobot_calibration_by_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """LeRobot <= 0.3 writes an SO-101's file under so101_follower, later releases under so_follower."""
    monkeypatch.setenv("HF_LEROBOT_CALIBRATION", str(tmp_path))
    path = write_calibration(tmp_path / "robots" / kind / "red_arm.json")
    robot = make_robot("so101", {"port": "/dev/ttyACM0", "id": "red_arm", "write_calibration": "true"})
    assert isinstance(robot, SOFollower)
    assert robot.calibration_path == path
    assert robot.spec.name == "so101"
    assert robot.config.write_calibration is True
    # an SO-100's file is not an SO-101's
    write_calibration(tmp_path / "robots" / "so100_follower" / "blue_arm.json")
    with pytest.raises(CalibrationError, match=r"so101_follower/blue_arm\.json does not exist"):
        make_robot("so101", {"port": "/dev/ttyACM0", "id": "blue_arm"})


def test_camera_strings() -> None:
    path = "/dev/v4l/by-path/pci-0000:00:14.0-usb-0:1:1.0-video-index0"
    assert parse_cameras(f"front:0:640x480@30, wrist:{path}:1280x720") == [
        CameraEntry("front", 0, 640, 480, 30.0),
        CameraEntry("wrist", path, 1280, 720, None),
    ]
    assert parse_cameras("top") == [CameraEntry("top", None, None, None, None)]
    assert parse_cameras("") == []
    with pytest.raises(ValueError, match="repeat"):
        parse_cameras("a,a")
    with pytest.raises(ValueError, match="not a valid camera name"):
        parse_cameras(":0")


def test_import_has_no_side_effects() -> None:
    code = (
        "import sys, threading, servo.robots; "
        "assert 'cv2' not in sys.modules, 'cv2 imported'; "
        "assert threading.active_count() == 1, threading.enumerate()"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_description_builds_joints_and_cameras_and_crosses_processes_as_json() -> None:
    description = RobotDescription("sim", {"cameras": "front:64x48", "fps": "50"})
    wire = msgspec.json.encode(description)
    assert msgspec.json.decode(wire, type=RobotDescription) == description
    robot = description.build()
    assert isinstance(robot, SimSO100)
    assert description.spec().fps == 50.0
    assert description.spec().cameras["front"].width == 64
    cameras = description.build_cameras(robot)
    assert isinstance(cameras, SimCameras)


PLUGINS = "tests.robots.plugin_arms"


def test_a_plugin_is_a_factory_named_by_path_with_its_own_options() -> None:
    description = RobotDescription(f"{PLUGINS}:twin", {"fps": "50", "camera": "true"})
    robot = description.build()
    assert isinstance(robot, SimSO100)
    assert robot.spec.fps == 50.0
    assert isinstance(description.build_cameras(robot), SimCameras)
    assert robot_summary(f"{PLUGINS}:twin") == "A simulated arm under another name (a plugin with options and cameras)."
    assert options_help(f"{PLUGINS}:twin") == [
        "fps (float, default 30.0): Control rate (Hz).",
        "camera (bool, default False): Give it a 64x48 camera named 'eye'.",
    ]
    # A factory may return the joints alone, and take no options.
    bare = RobotDescription(f"{PLUGINS}:bare")
    assert isinstance(bare.build(), SimSO100)
    assert isinstance(bare.build_cameras(bare.build()), NoCameras)
    assert options_help(f"{PLUGINS}:bare") == []


@pytest.mark.parametrize(
    ("robot", "options", "message"),
    [
        (f"{PLUGINS}:twin", {"fsp": "5"}, f"robot '{PLUGINS}:twin': fsp: unknown key (valid: camera, fps)"),
        (f"{PLUGINS}:twin", {"fps": "-1"}, f"robot '{PLUGINS}:twin': fps = '-1': expected float > 0.0"),
        (f"{PLUGINS}:bare", {"fps": "5"}, f"robot '{PLUGINS}:bare' takes no options, got fps"),
        (
            "nosuch.module:make",
            {},
            "robot 'nosuch.module:make': cannot import 'nosuch.module' (No module named 'nosuch'); "
            "is it installed, or on PYTHONPATH?",
        ),
        (f"{PLUGINS}:missing", {}, f"robot '{PLUGINS}:missing': '{PLUGINS}' has no callable 'missing'"),
        (f"{PLUGINS}:NOT_CALLABLE", {}, f"robot '{PLUGINS}:NOT_CALLABLE': '{PLUGINS}' has no callable 'NOT_CALLABLE'"),
        (
            f"{PLUGINS}:two_parameters",
            {},
            f"robot '{PLUGINS}:two_parameters': a robot factory takes one parameter, its options Struct; "
            "this one takes (options: 'TwinOptions', extra: 'int')",
        ),
        (
            f"{PLUGINS}:unannotated",
            {},
            f"robot '{PLUGINS}:unannotated': parameter 'options' of the factory must be annotated with a "
            "msgspec.Struct of options, got None",
        ),
        (
            f"{PLUGINS}:not_a_struct",
            {},
            f"robot '{PLUGINS}:not_a_struct': parameter 'options' of the factory must be annotated with a "
            "msgspec.Struct of options, got dict[str, int]",
        ),
        (
            f"{PLUGINS}:returns_a_number",
            {},
            f"robot '{PLUGINS}:returns_a_number': the factory returned int, not a Robot (spec, connect, "
            "disconnect, read_state, send_action) or RobotParts",
        ),
        (
            f"{PLUGINS}:fails",
            {},
            f"robot '{PLUGINS}:fails' failed to build: RuntimeError: the arm's driver library is missing",
        ),
    ],
)
def test_an_unusable_plugin_is_one_line_naming_what_failed(robot: str, options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        RobotDescription(robot, options).build()
    assert str(info.value) == message
