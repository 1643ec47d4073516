"""Robot drivers: the `Robot` / `Cameras` protocols, a simulated and a real SO-100 arm, and their registry.

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
from .protocol import Cameras, CameraSpec, FloatArray, Frame, NoCameras, PoseSource, Robot, RobotSpec
from .registry import (
    ROBOTS,
    RobotDescription,
    RobotEntry,
    SimOptions,
    SO100Options,
    make_robot,
    options_help,
    robot_options,
)
from .sim import SimCameraConfig, SimConfig, SimSO100
from .sim_cameras import SimCameras
from .so100 import SO100, SO100Config

__all__ = [
    "ROBOTS",
    "SO100",
    "STS3215",
    "CalibrationError",
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
    "RobotEntry",
    "RobotSpec",
    "SO100Config",
    "SO100Options",
    "SimCameraConfig",
    "SimCameras",
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
