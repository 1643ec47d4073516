"""A plausible SO-100 calibration, as LeRobot would write it, for the tests."""

from __future__ import annotations

from pathlib import Path

from servo.robots.calibration import MotorCalibration, save_calibration

CALIBRATION = {
    "shoulder_pan": MotorCalibration(1, 0, -420, 760, 3340),
    "shoulder_lift": MotorCalibration(2, 0, 1012, 820, 3210),
    "elbow_flex": MotorCalibration(3, 0, -1107, 870, 3100),
    "wrist_flex": MotorCalibration(4, 0, 130, 900, 3150),
    "wrist_roll": MotorCalibration(5, 0, -35, 0, 4095),
    "gripper": MotorCalibration(6, 0, 1400, 2010, 3410),
}


def write_calibration(path: Path) -> Path:
    save_calibration(path, CALIBRATION)
    return path
