"""Robot drivers: the `Robot` protocol, a simulated and a real SO-100 arm, and their registry.

Importing this package starts nothing and loads neither OpenCV nor any device; drivers are
picked by name from `ROBOTS` / `make_robot`.
"""

from .calibration import (
    CalibrationError,
    CalibrationNotFoundError,
    JointNormalizer,
    MotorCalibration,
    NormMode,
    default_calibration_path,
    load_calibration,
    save_calibration,
)
from .cameras import CameraError, OpenCVCamera, OpenCVCameraConfig
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
from .protocol import CameraSpec, FloatArray, Frame, Robot, RobotSpec
from .registry import ROBOTS, RobotEntry, SimOptions, SO100Options, make_robot, options_help, robot_options
from .sim import SimCameraConfig, SimConfig, SimSO100
from .so100 import SO100, SO100Config

__all__ = [
    "ROBOTS",
    "SO100",
    "STS3215",
    "CalibrationError",
    "CalibrationNotFoundError",
    "CameraError",
    "CameraSpec",
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
    "NormMode",
    "OpenCVCamera",
    "OpenCVCameraConfig",
    "Register",
    "Robot",
    "RobotEntry",
    "RobotSpec",
    "SO100Config",
    "SO100Options",
    "SimCameraConfig",
    "SimConfig",
    "SimOptions",
    "SimSO100",
    "default_calibration_path",
    "load_calibration",
    "make_robot",
    "options_help",
    "robot_options",
    "save_calibration",
]
