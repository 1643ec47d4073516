from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from servo.robots.calibration import (
    CalibrationError,
    CalibrationNotFoundError,
    JointNormalizer,
    MotorCalibration,
    NormMode,
    default_calibration_path,
    load_calibration,
    save_calibration,
)
from servo.robots.so100_joints import MOTOR_NAMES
from tests.robots.calib_data import CALIBRATION, write_calibration

ARM = [NormMode.DEGREES] * 5 + [NormMode.RANGE_0_100]


def test_round_trip_keeps_lerobot_layout(tmp_path: Path) -> None:
    path = write_calibration(tmp_path / "so100_follower" / "arm.json")
    assert load_calibration(path, MOTOR_NAMES) == CALIBRATION
    data = json.loads(path.read_text())
    assert list(data) == list(MOTOR_NAMES)
    assert data["shoulder_pan"] == {
        "id": 1,
        "drive_mode": 0,
        "homing_offset": -420,
        "range_min": 760,
        "range_max": 3340,
    }


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(CalibrationNotFoundError, match=r"nope\.json does not exist") as info:
        load_calibration(path)
    assert isinstance(info.value, FileNotFoundError)


def test_malformed_json_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{\n  "gripper": {,\n}')
    with pytest.raises(CalibrationError, match=r"bad\.json is not valid JSON \(line 2"):
        load_calibration(path)


def test_missing_motor_is_named(tmp_path: Path) -> None:
    path = write_calibration(tmp_path / "arm.json")
    data = json.loads(path.read_text())
    del data["gripper"]
    path.write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match=r"arm\.json has no entry for motor\(s\) \['gripper'\]"):
        load_calibration(path, MOTOR_NAMES)


def test_missing_key_is_named(tmp_path: Path) -> None:
    path = write_calibration(tmp_path / "arm.json")
    data = json.loads(path.read_text())
    del data["elbow_flex"]["range_max"]
    path.write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match=r"arm\.json: 'elbow_flex' lacks the key 'range_max'"):
        load_calibration(path)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("homing_offset", "12", r"wrist_flex\.homing_offset must be an integer"),
        ("drive_mode", True, r"wrist_flex\.drive_mode must be an integer"),
        ("drive_mode", 2, r"wrist_flex\.drive_mode must be 0 or 1"),
        ("range_min", 4000, r"wrist_flex needs 0 <= range_min < range_max"),
    ],
)
def test_bad_values_are_named(tmp_path: Path, key: str, value: object, message: str) -> None:
    path = write_calibration(tmp_path / "arm.json")
    data = json.loads(path.read_text())
    data["wrist_flex"][key] = value
    path.write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match=message):
        load_calibration(path)


SO100_TYPES = ("so100_follower", "so_follower")


def test_default_path_follows_lerobot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HF_LEROBOT_CALIBRATION", "HF_LEROBOT_HOME", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    expected = tmp_path / ".cache/huggingface/lerobot/calibration/robots/so100_follower/arm.json"
    assert default_calibration_path("arm", SO100_TYPES) == expected
    # Newer LeRobot releases write under so_follower; an existing file there is found.
    newer = tmp_path / ".cache/huggingface/lerobot/calibration/robots/so_follower/b.json"
    write_calibration(newer)
    assert default_calibration_path("b", SO100_TYPES) == newer
    monkeypatch.setenv("HF_LEROBOT_CALIBRATION", str(tmp_path / "cal"))
    assert default_calibration_path("arm", SO100_TYPES) == tmp_path / "cal/robots/so100_follower/arm.json"
    assert default_calibration_path("arm", ("so101_follower",)) == tmp_path / "cal/robots/so101_follower/arm.json"


def _lerobot_normalize(raw: int, cal: MotorCalibration, mode: NormMode) -> float:
    # LeRobot's MotorsBus._normalize, written out per motor.
    lo, hi = cal.range_min, cal.range_max
    if mode is NormMode.DEGREES:
        return (raw - (lo + hi) / 2) * 360 / 4095
    bounded = min(hi, max(lo, raw))
    norm = (bounded - lo) / (hi - lo) * 100
    return 100 - norm if cal.drive_mode else norm


def _lerobot_unnormalize(value: float, cal: MotorCalibration, mode: NormMode) -> int:
    lo, hi = cal.range_min, cal.range_max
    if mode is NormMode.DEGREES:
        return int(value * 4095 / 360 + (lo + hi) / 2)
    value = 100 - value if cal.drive_mode else value
    return int(min(100.0, max(0.0, value)) / 100 * (hi - lo) + lo)


def test_normalisation_matches_lerobot_formulas() -> None:
    cals = list(CALIBRATION.values())
    norm = JointNormalizer(cals, ARM)
    raw = np.array([2050, 800, 3000, 900, 4095, 2710])
    units = norm.to_units(raw)
    expected = [_lerobot_normalize(int(r), c, m) for r, c, m in zip(raw, cals, ARM, strict=True)]
    np.testing.assert_allclose(units, expected)
    assert units[5] == pytest.approx(50.0)
    back = norm.to_raw(units)
    expected_raw = [_lerobot_unnormalize(u, c, m) for u, c, m in zip(units, cals, ARM, strict=True)]
    assert back.tolist() == expected_raw
    assert np.all(np.abs(back - raw) <= 1)


def test_gripper_drive_mode_mirrors_and_degrees_ignore_it() -> None:
    inverted = [MotorCalibration(1, 1, 0, 1000, 3000), MotorCalibration(6, 1, 0, 1000, 3000)]
    norm = JointNormalizer(inverted, [NormMode.DEGREES, NormMode.RANGE_0_100])
    np.testing.assert_allclose(norm.to_units([2500, 1500]), [500 * 360 / 4095, 75.0])
    assert norm.to_raw([500 * 360 / 4095, 75.0]).tolist() == [2500, 1500]


def test_symmetric_range_mode() -> None:
    cals = [MotorCalibration(1, 0, 0, 1000, 3000), MotorCalibration(2, 1, 0, 1000, 3000)]
    norm = JointNormalizer(cals, [NormMode.RANGE_M100_100] * 2)
    np.testing.assert_allclose(norm.to_units([1500, 1500]), [-50.0, 50.0])
    assert norm.to_raw([-50.0, 50.0]).tolist() == [1500, 1500]
    assert norm.to_raw([-500.0, 500.0]).tolist() == [1000, 1000]


@given(st.lists(st.integers(0, 4095), min_size=6, max_size=6))
def test_raw_round_trip_within_one_tick(raw: list[int]) -> None:
    norm = JointNormalizer(list(CALIBRATION.values()), ARM)
    clamped = norm.clamp_raw(raw)
    assert np.all(np.abs(norm.to_raw(norm.to_units(clamped)) - clamped) <= 1)


def test_equal_range_is_rejected() -> None:
    with pytest.raises(CalibrationError, match="range_min == range_max"):
        JointNormalizer([MotorCalibration(3, 0, 0, 5, 5)], [NormMode.DEGREES])


def test_save_is_atomic_and_creates_dirs(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "arm.json"
    save_calibration(path, CALIBRATION)
    save_calibration(path, CALIBRATION)
    assert sorted(p.name for p in path.parent.iterdir()) == ["arm.json"]
