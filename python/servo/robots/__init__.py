"""Robot drivers: the `Robot` / `Cameras` protocols, the sim arm, SO-100 / SO-101, ROS 2 robots, and their registry.

Importing this package starts nothing and loads neither OpenCV, Cyclone DDS nor any device; drivers are
picked by name from `ROBOTS` / `make_robot`, or named as a plugin, ``package.module:factory``
(`servo.robots.registry` has the contract).
"""

from .builtin import SimOptions, SOFollowerOptions
from .calibration import (
    CalibrationError,
    CalibrationMismatchError,
    CalibrationNotFoundError,
    JointNormalizer,
    MotorCalibration,
    NormMode,
    default_calibration_path,
    load_calibration,
    save_calibration,
)
from .cameras import CameraError, CameraGroup, OpenCVCamera, OpenCVCameraConfig
from .capture import CaptureThread, LatestFrame
from .feetech import (
    STS3215,
    FeetechBus,
    FeetechChecksumError,
    FeetechError,
    FeetechProtocolError,
    FeetechStatusError,
    FeetechTimeoutError,
    Register,
)
from .protocol import (
    Cameras,
    CameraSpec,
    FloatArray,
    Frame,
    NoCameras,
    PoseSource,
    Robot,
    RobotFault,
    RobotParts,
    RobotSpec,
)
from .registry import (
    ROBOTS,
    RobotDescription,
    build_parts,
    make_robot,
    options_help,
    robot_options,
    robot_summary,
)
from .ros2.options import Ros2Options
from .sim import SimCameraConfig, SimConfig, SimSO100
from .sim_cameras import SimCameras
from .so_follower import SO100_ARM, SO101_ARM, SOArm, SOFollower, SOFollowerConfig

__all__ = [
    "ROBOTS",
    "SO100_ARM",
    "SO101_ARM",
    "STS3215",
    "CalibrationError",
    "CalibrationMismatchError",
    "CalibrationNotFoundError",
    "CameraError",
    "CameraGroup",
    "CameraSpec",
    "Cameras",
    "CaptureThread",
    "FeetechBus",
    "FeetechChecksumError",
    "FeetechError",
    "FeetechProtocolError",
    "FeetechStatusError",
    "FeetechTimeoutError",
    "FloatArray",
    "Frame",
    "JointNormalizer",
    "LatestFrame",
    "MotorCalibration",
    "NoCameras",
    "NormMode",
    "OpenCVCamera",
    "OpenCVCameraConfig",
    "PoseSource",
    "Register",
    "Robot",
    "RobotDescription",
    "RobotFault",
    "RobotParts",
    "RobotSpec",
    "Ros2Options",
    "SOArm",
    "SOFollower",
    "SOFollowerConfig",
    "SOFollowerOptions",
    "SimCameraConfig",
    "SimCameras",
    "SimConfig",
    "SimOptions",
    "SimSO100",
    "build_parts",
    "default_calibration_path",
    "load_calibration",
    "make_robot",
    "options_help",
    "robot_options",
    "robot_summary",
    "save_calibration",
]
