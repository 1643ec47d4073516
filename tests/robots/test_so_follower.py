from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servo.robots import SO100_ARM, SO101_ARM, Robot, SOArm, SOFollower, SOFollowerConfig
from servo.robots.calibration import CalibrationError, CalibrationMismatchError
from servo.robots.so100_joints import JOINT_NAMES, MOTOR_NAMES
from tests.robots.calib_data import CALIBRATION, store_calibration, write_calibration
from tests.robots.feetech_emulator import (
    ADDR_GOAL_POSITION,
    ADDR_HOMING_OFFSET,
    ADDR_LOCK,
    ADDR_MAX_LIMIT,
    ADDR_MIN_LIMIT,
    ADDR_PRESENT_POSITION,
    ADDR_TORQUE_ENABLE,
    FeetechEmulator,
)

IDS = range(1, 7)
CALS = [CALIBRATION[name] for name in MOTOR_NAMES]


def degrees(raw: int, motor: int) -> float:
    cal = CALS[motor - 1]
    return (raw - (cal.range_min + cal.range_max) / 2) * 360 / 4095


def raw_for_degrees(value: float, motor: int) -> int:
    cal = CALS[motor - 1]
    return int(value * 4095 / 360 + (cal.range_min + cal.range_max) / 2)


@pytest.fixture
def calibration_file(tmp_path: Path, emulator: FeetechEmulator) -> Path:
    """This arm's calibration file; its motors hold the same calibration (it was written to them)."""
    store_calibration(emulator, CALIBRATION)
    return write_calibration(tmp_path / "so100_follower" / "my_arm.json")


def make_arm(emulator: FeetechEmulator, calibration_file: Path, **kw: Any) -> SOFollower:
    return SOFollower(SOFollowerConfig(port=emulator.port, calibration_path=calibration_file, timeout_s=0.03, **kw))


@pytest.fixture
def arm(emulator: FeetechEmulator, calibration_file: Path) -> Iterator[SOFollower]:
    robot = make_arm(emulator, calibration_file)
    robot.connect()
    yield robot
    robot.disconnect()


def test_spec_follows_lerobot_and_calibration(emulator: FeetechEmulator, calibration_file: Path) -> None:
    robot = make_arm(emulator, calibration_file)
    assert isinstance(robot, Robot)
    spec = robot.spec
    assert spec.joint_names == JOINT_NAMES
    assert spec.joint_names[0] == "shoulder_pan.pos"
    pan = CALIBRATION["shoulder_pan"]
    half_range = (pan.range_max - pan.range_min) / 2 * 360 / 4095
    assert spec.lower[0] == pytest.approx(-half_range)
    assert spec.upper[0] == pytest.approx(half_range)
    assert (spec.lower[5], spec.upper[5]) == (0.0, 100.0)
    assert all(lo <= r <= hi for lo, r, hi in zip(spec.lower, spec.rest_pose, spec.upper, strict=True))
    assert not robot.is_connected  # building it touched no port


@pytest.mark.parametrize(("use_degrees", "arm_unit"), [(True, "degrees"), (False, "range_m100_100")])
def test_spec_declares_lerobots_units(
    emulator: FeetechEmulator, calibration_file: Path, use_degrees: bool, arm_unit: str
) -> None:
    spec = make_arm(emulator, calibration_file, use_degrees=use_degrees).spec
    # LeRobot's so100_follower: MotorNormMode per use_degrees for the arm, RANGE_0_100 for the gripper.
    assert spec.units == (arm_unit,) * 5 + ("range_0_100",)


@pytest.mark.parametrize("model", [SO100_ARM, SO101_ARM], ids=["so100", "so101"])
def test_connect_configures_motors_like_lerobot(
    emulator: FeetechEmulator, calibration_file: Path, model: SOArm
) -> None:
    with make_arm(emulator, calibration_file, arm=model) as arm:
        assert arm.spec.name == model.name
        assert arm.spec.joint_names == JOINT_NAMES  # LeRobot's so100_follower / so101_follower features
    # The motors already held the file's calibration: no EEPROM calibration write.
    calibration_registers = {ADDR_HOMING_OFFSET, ADDR_MIN_LIMIT, ADDR_MAX_LIMIT}
    assert not [w for w in emulator.writes if w[2] in calibration_registers]
    for motor_id in IDS:
        assert emulator.get(motor_id, 33, 1) == 0  # position mode
        assert emulator.get(motor_id, 21, 1) == 16  # P coefficient
    assert emulator.get(6, 16) == 500  # gripper torque limit (LeRobot >= 0.4, both arms)


def test_connect_enables_torque_and_locks(emulator: FeetechEmulator, arm: SOFollower) -> None:
    for motor_id in IDS:
        assert emulator.get(motor_id, ADDR_TORQUE_ENABLE, 1) == 1
        assert emulator.get(motor_id, ADDR_LOCK, 1) == 1


def test_connect_holds_the_present_pose(emulator: FeetechEmulator, calibration_file: Path) -> None:
    emulator.set(3, ADDR_PRESENT_POSITION, 1234)
    emulator.set(3, ADDR_GOAL_POSITION, 3000)  # stale goal from an earlier session
    with make_arm(emulator, calibration_file):
        assert emulator.get(3, ADDR_GOAL_POSITION) == 1234
        assert emulator.get(3, ADDR_PRESENT_POSITION) == 1234


def test_read_state_applies_lerobot_normalisation(emulator: FeetechEmulator, arm: SOFollower) -> None:
    raws = {1: 2500, 2: 900, 3: 3100, 4: 2048, 5: 10, 6: 2710}
    for motor_id, raw in raws.items():
        emulator.set(motor_id, ADDR_PRESENT_POSITION, raw)
    state = arm.read_state()
    assert state.dtype == np.float32
    assert state.shape == (6,)
    expected = [degrees(raws[m], m) for m in range(1, 6)] + [(2710 - 2010) / 1400 * 100]
    np.testing.assert_allclose(state, expected, rtol=1e-6, atol=1e-4)


def test_read_state_decodes_negative_positions(emulator: FeetechEmulator, arm: SOFollower) -> None:
    emulator.set(5, ADDR_PRESENT_POSITION, 0x8000 | 12)  # -12 ticks past zero
    assert arm.read_state()[4] == pytest.approx(degrees(-12, 5), abs=1e-4)


def test_send_action_writes_goal_ticks(emulator: FeetechEmulator, arm: SOFollower) -> None:
    target = np.array([10.0, -20.0, 30.5, 0.0, -45.0, 25.0], dtype=np.float32)
    arm.send_action(target)
    expected = [raw_for_degrees(float(target[m - 1]), m) for m in range(1, 6)]
    expected.append(int(25.0 / 100 * 1400 + 2010))
    assert emulator.wait_for(lambda: [emulator.get(m, ADDR_GOAL_POSITION) for m in IDS] == expected), [
        emulator.get(m, ADDR_GOAL_POSITION) for m in IDS
    ]
    # The emulated servos are instant, so the state now reads back the target.
    np.testing.assert_allclose(arm.read_state(), target, atol=0.1)


def test_out_of_range_targets_are_clamped(emulator: FeetechEmulator, arm: SOFollower) -> None:
    arm.send_action(np.array([500.0, -500.0, 0.0, 0.0, 0.0, 150.0], dtype=np.float32))
    pan, lift, grip = (
        CALIBRATION["shoulder_pan"],
        CALIBRATION["shoulder_lift"],
        CALIBRATION["gripper"],
    )
    assert emulator.wait_for(lambda: emulator.get(6, ADDR_GOAL_POSITION) == grip.range_max)
    assert emulator.get(1, ADDR_GOAL_POSITION) == pan.range_max
    assert emulator.get(2, ADDR_GOAL_POSITION) == lift.range_min


def test_max_relative_target_limits_each_step(emulator: FeetechEmulator, calibration_file: Path) -> None:
    for motor_id in IDS:
        emulator.set(motor_id, ADDR_PRESENT_POSITION, 2048)
    with make_arm(emulator, calibration_file, max_relative_target=5.0) as arm:
        start = arm.read_state()
        arm.send_action(start + np.float32(50.0))
        moved = arm.read_state() - start
    np.testing.assert_allclose(moved, 5.0, atol=0.1)


def test_send_action_rejects_bad_targets(arm: SOFollower) -> None:
    with pytest.raises(ValueError, match="shape"):
        arm.send_action(np.zeros(5, dtype=np.float32))
    with pytest.raises(ValueError, match="non-finite"):
        arm.send_action(np.array([0, 0, np.nan, 0, 0, 0], dtype=np.float32))


def test_missing_motor_fails_connect_naming_it(emulator: FeetechEmulator, calibration_file: Path) -> None:
    emulator.configure(missing_ids={3, 6})
    robot = make_arm(emulator, calibration_file)
    with pytest.raises(ConnectionError, match=r"motor id\(s\) \[3, 6\] \(elbow_flex, gripper\)"):
        robot.connect()
    assert not robot.is_connected
    assert emulator.get(1, ADDR_TORQUE_ENABLE, 1) == 0


def test_wrong_model_fails_connect(emulator: FeetechEmulator, calibration_file: Path) -> None:
    emulator.set(4, 3, 1234)
    with pytest.raises(ConnectionError, match=r"model numbers \{4: 1234\}"):
        make_arm(emulator, calibration_file).connect()


def test_disconnect_disables_torque_and_is_idempotent(emulator: FeetechEmulator, arm: SOFollower) -> None:
    arm.disconnect()
    arm.disconnect()
    assert not arm.is_connected
    assert [emulator.get(m, ADDR_TORQUE_ENABLE, 1) for m in IDS] == [0] * 6
    assert [emulator.get(m, ADDR_LOCK, 1) for m in IDS] == [0] * 6


def test_torque_can_stay_on_at_disconnect(emulator: FeetechEmulator, calibration_file: Path) -> None:
    robot = make_arm(emulator, calibration_file, disable_torque_on_disconnect=False)
    robot.connect()
    robot.connect()  # idempotent
    robot.disconnect()
    assert [emulator.get(m, ADDR_TORQUE_ENABLE, 1) for m in IDS] == [1] * 6


def test_calibration_with_wrong_id_is_refused(emulator: FeetechEmulator, tmp_path: Path) -> None:
    path = write_calibration(tmp_path / "arm.json")
    path.write_text(path.read_text().replace('"id": 3', '"id": 9'))
    with pytest.raises(CalibrationError, match=r"arm\.json: elbow_flex: id is 9"):
        make_arm(emulator, path)


def test_config_needs_one_calibration_source() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        SOFollowerConfig(port="/dev/null")
    with pytest.raises(ValueError, match="exactly one"):
        SOFollowerConfig(port="/dev/null", calibration_path="a.json", robot_id="b")


def signed_offset(emulator: FeetechEmulator, motor_id: int) -> int:
    offset = emulator.get(motor_id, ADDR_HOMING_OFFSET)
    return -(offset & 0x7FF) if offset & 0x800 else offset


def stored(emulator: FeetechEmulator) -> list[tuple[int, int, int]]:
    return [(signed_offset(emulator, m), emulator.get(m, ADDR_MIN_LIMIT), emulator.get(m, ADDR_MAX_LIMIT)) for m in IDS]


@pytest.fixture
def uncalibrated_file(tmp_path: Path) -> Path:
    """A calibration file whose values the motors do not hold (factory settings: 0, 0..4095)."""
    return write_calibration(tmp_path / "so101_follower" / "other_arm.json")


def test_motors_holding_another_calibration_refuse_to_start_untouched(
    emulator: FeetechEmulator, uncalibrated_file: Path
) -> None:
    robot = make_arm(emulator, uncalibrated_file)
    with pytest.raises(CalibrationMismatchError) as info:
        robot.connect()
    message = str(info.value)
    assert message == (
        f"SO-100 on {emulator.port}: motor shoulder_pan (id 1) holds homing_offset 0, range 0..4095 "
        f"(and 5 more motor(s)), but {uncalibrated_file} says homing_offset -420, range 760..3340: if that file "
        "is this arm's, write it into the motors with --robot-opt write_calibration=true; otherwise give this "
        "arm's own id= or calibration="
    )
    assert not robot.is_connected
    assert emulator.writes == []  # nothing written: no calibration, no torque, no configuration
    assert stored(emulator) == [(0, 0, 4095)] * 6


def test_one_motor_of_another_arm_is_named(emulator: FeetechEmulator, calibration_file: Path) -> None:
    emulator.set(3, ADDR_MIN_LIMIT, 900)  # elbow_flex holds another arm's lower limit
    with pytest.raises(CalibrationMismatchError, match=r"^SO-101 on .*: motor elbow_flex \(id 3\) holds") as info:
        make_arm(emulator, calibration_file, arm=SO101_ARM).connect()
    assert "range 900..3100, but" in str(info.value)  # only that motor: no "more motor(s)"
    assert "\n" not in str(info.value)
    assert emulator.writes == []


def test_write_calibration_writes_the_file_into_the_motors(emulator: FeetechEmulator, uncalibrated_file: Path) -> None:
    with make_arm(emulator, uncalibrated_file, write_calibration=True):
        assert stored(emulator) == [(c.homing_offset, c.range_min, c.range_max) for c in CALS]
        assert all(emulator.get(m, ADDR_TORQUE_ENABLE, 1) == 1 for m in IDS)
    # Once written, the next connection finds them equal and writes no calibration again.
    emulator.configure(writes=[])
    with make_arm(emulator, uncalibrated_file):
        pass
    assert not [w for w in emulator.writes if w[2] in (ADDR_HOMING_OFFSET, ADDR_MIN_LIMIT, ADDR_MAX_LIMIT)]
