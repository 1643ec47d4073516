"""A plausible SO-100 calibration, as LeRobot would write it, for the tests."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from servo.robots.calibration import MotorCalibration, save_calibration
from tests.robots.feetech_emulator import ADDR_HOMING_OFFSET, ADDR_MAX_LIMIT, ADDR_MIN_LIMIT, FeetechEmulator

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


def store_calibration(emulator: FeetechEmulator, calibration: Mapping[str, MotorCalibration]) -> None:
    """Put a calibration into the emulated motors' registers, as writing it to a real arm would."""
    for cal in calibration.values():
        # Sign-magnitude, sign in bit 11 (written out here, not with the driver's codec).
        offset = (1 << 11 | -cal.homing_offset) if cal.homing_offset < 0 else cal.homing_offset
        emulator.set(cal.id, ADDR_HOMING_OFFSET, offset)
        emulator.set(cal.id, ADDR_MIN_LIMIT, cal.range_min)
        emulator.set(cal.id, ADDR_MAX_LIMIT, cal.range_max)
