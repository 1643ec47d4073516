"""The real SO-100 and SO-101 follower arms: six STS3215 servos on a Feetech bus.

Their OpenCV cameras are a `servo.robots.cameras.CameraGroup` in the edge's main process.

Behaves like LeRobot's ``so100_follower`` / ``so101_follower`` (same motor ids, feature names,
units, calibration file and connect-time configuration) so policies trained on LeRobot datasets
drive them unchanged. The two arms differ in their printed parts, not in anything the driver
sees: same motors (STS3215, ids 1-6), names, units and registers. LeRobot up to 0.3 kept them
apart (its own class each, calibration under ``so100_follower`` / ``so101_follower``; the SO-101's
wrist roll is calibrated over its recorded range instead of a full turn, which the file carries)
and from 0.4 on drives both with one class whose calibration lives under ``so_follower``. An
`SOArm` row holds what differs: the name, and where LeRobot keeps the calibration.

The calibration file is checked against the motors at connect: the motors' homing offsets and
position limits must be the file's. Writing the file into the motors (EEPROM) happens only when
asked (``write_calibration``); otherwise a difference refuses the connection with one line
naming the motor, because it usually means the file of another arm (a wrong ``id``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

import numpy as np

from servo.logs import get_logger

from . import so100_joints as joints
from .calibration import (
    CalibrationError,
    CalibrationMismatchError,
    JointNormalizer,
    MotorCalibration,
    NormMode,
    default_calibration_path,
    load_calibration,
)
from .cameras import OpenCVCameraConfig
from .feetech import STS3215, FeetechBus, FeetechError, describe_status_error
from .protocol import FloatArray, RobotSpec

_log = get_logger(__name__)

# Written at connect, as LeRobot's SO follower `configure()` does: softer position loop than the
# factory P=32 to avoid shaking, and a gripper that cannot burn out squeezing an object.
_P, _I, _D = 16, 0, 32
_GRIPPER_LIMITS = (
    (STS3215.MAX_TORQUE_LIMIT, 500),
    (STS3215.PROTECTION_CURRENT, 250),
    (STS3215.OVERLOAD_TORQUE, 25),
)
_POSITION_MODE = 0


@dataclass(frozen=True)
class SOArm:
    """A model of the SO follower family: what differs between them. Immutable.

    Attributes:
        name: servo's robot type (the spec's name), e.g. ``"so101"``.
        label: How messages name it, e.g. ``"SO-101"``.
        lerobot_types: LeRobot robot types whose calibration directory may hold its file, oldest
            first (`servo.robots.calibration.default_calibration_path`).
    """

    name: str
    label: str
    lerobot_types: tuple[str, ...]


SO100_ARM = SOArm("so100", "SO-100", ("so100_follower", "so_follower"))
SO101_ARM = SOArm("so101", "SO-101", ("so101_follower", "so_follower"))


@dataclass(frozen=True)
class SOFollowerConfig:
    """Configuration of the real arm; immutable, so any thread may read it.

    Attributes:
        port: Serial device of the servo bus, e.g. ``/dev/ttyACM0``.
        arm: Which arm of the family (`SO100_ARM`, `SO101_ARM`).
        calibration_path: LeRobot calibration JSON to use.
        robot_id: Instead of a path, the LeRobot robot id: the file is looked up where LeRobot
            writes it (`default_calibration_path`). Exactly one of the two must be given.
        write_calibration: Write the file's offsets and limits into motors that hold others
            (EEPROM); without it such motors refuse the connection.
        cameras: Camera name -> OpenCV camera config (for the spec; the edge opens them).
        max_relative_target: If set, each command moves a joint at most this far (units) from
            the last read position, like LeRobot's option of the same name.
        use_degrees: Arm joints in degrees (LeRobot's default); ``False`` gives -100..100.
        disable_torque_on_disconnect: Let the arm go limp on disconnect (LeRobot's default).
        fps: Control rate advertised in the spec.
        baudrate: Bus line rate.
        timeout_s: Reply timeout of each bus packet.
        retries: Bus retries after a timeout or a corrupted reply.
    """

    port: str
    arm: SOArm = SO100_ARM
    calibration_path: str | os.PathLike[str] | None = None
    robot_id: str | None = None
    write_calibration: bool = False
    cameras: Mapping[str, OpenCVCameraConfig] = field(default_factory=dict)
    max_relative_target: float | None = None
    use_degrees: bool = True
    disable_torque_on_disconnect: bool = True
    fps: float = 30.0
    baudrate: int = 1_000_000
    timeout_s: float = 0.05
    retries: int = 2

    def __post_init__(self) -> None:
        if (self.calibration_path is None) == (self.robot_id is None):
            raise ValueError("SOFollowerConfig needs exactly one of calibration_path or robot_id")
        if self.max_relative_target is not None and self.max_relative_target <= 0:
            raise ValueError("SOFollowerConfig.max_relative_target must be positive")

    def resolved_calibration_path(self) -> Path:
        """The calibration file this config points at."""
        if self.calibration_path is not None:
            return Path(self.calibration_path).expanduser()
        assert self.robot_id is not None
        return default_calibration_path(self.robot_id, self.arm.lerobot_types)


class SOFollower:
    """An SO-100 or SO-101 follower arm's joints, implementing the `Robot` protocol.

    Owned by the control-loop thread: the bus is half-duplex and not thread-safe, so `connect`,
    `read_state`, `send_action` and `disconnect` must all come from that one thread. Its cameras
    are opened by the edge's main process, before this arm is connected (as LeRobot does: a
    camera that fails to start must not leave a powered arm behind).
    """

    def __init__(self, config: SOFollowerConfig) -> None:
        """Load the calibration and build the spec; nothing is opened until `connect`.

        Raises:
            CalibrationError: The calibration file is missing or malformed.
        """
        self.config = config
        self.calibration_path = config.resolved_calibration_path()
        self.calibration = load_calibration(self.calibration_path, joints.MOTOR_NAMES)
        cals = [self.calibration[name] for name in joints.MOTOR_NAMES]
        self._check_calibration(cals)
        body = NormMode.DEGREES if config.use_degrees else NormMode.RANGE_M100_100
        modes = [body] * 5 + [NormMode.RANGE_0_100]
        self._norm = JointNormalizer(cals, modes, STS3215.RESOLUTION)
        self._spec = self._build_spec(cals, modes)
        self._bus = FeetechBus(config.port, config.baudrate, config.timeout_s, config.retries)
        self._last_state: FloatArray | None = None
        self._torque_may_be_on = False
        self._reported_errors: dict[int, int] = {}
        self._log = _log.bind(robot=config.arm.name, port=config.port)

    @property
    def spec(self) -> RobotSpec:
        """Static description, with joint limits taken from the calibration."""
        return self._spec

    @property
    def is_connected(self) -> bool:
        """Whether the bus is open."""
        return self._bus.is_open

    def connect(self) -> None:
        """Open the bus, check the motors and their calibration, configure them, enable torque.

        Idempotent. On failure the bus is closed again (torque released if it was enabled); a
        refused calibration leaves the motors untouched.

        Raises:
            ConnectionError: Motors are missing or are not STS3215s.
            CalibrationMismatchError: The motors hold another calibration than the file and
                ``write_calibration`` is off.
            FeetechError: Bus errors.
        """
        if self._bus.is_open:
            return
        self._bus.open()
        self._torque_may_be_on = False
        self._last_state = None
        try:
            self._check_motors()
            differing = self._differing_calibration()
            if differing and not self.config.write_calibration:
                raise CalibrationMismatchError(self._mismatch_message(differing))
            self._configure(differing)
        except BaseException:
            self._close(disable_torque=self._torque_may_be_on)
            raise
        self._log.info("connected", calibration=str(self.calibration_path))

    def disconnect(self) -> None:
        """Optionally release torque and close the bus. Idempotent."""
        if not self._bus.is_open:
            return
        self._close(disable_torque=self.config.disable_torque_on_disconnect)
        self._log.info("disconnected")

    def read_state(self) -> FloatArray:
        """Present positions of the six joints, one sync read, float32 in joint units."""
        raw = self._bus.sync_read(STS3215.PRESENT_POSITION, joints.MOTOR_IDS, check_status=False)
        self._note_status_errors()
        ticks = np.array([raw[i] for i in joints.MOTOR_IDS], dtype=np.int64)
        state = self._norm.to_units(ticks).astype(np.float32)
        self._last_state = state
        return state

    def send_action(self, target: FloatArray) -> None:
        """Command joint targets: unnormalise, clamp to the calibrated range, one sync write.

        Raises:
            ValueError: ``target`` has the wrong shape or non-finite values.
        """
        goal = np.asarray(target, dtype=np.float64)
        if goal.shape != (len(joints.MOTOR_IDS),):
            raise ValueError(f"target has shape {goal.shape}, expected ({len(joints.MOTOR_IDS)},)")
        if not np.all(np.isfinite(goal)):
            raise ValueError(f"target has non-finite values: {goal.tolist()}")
        if self.config.max_relative_target is not None:
            # The control loop reads the state every tick, so the last read stands in for the
            # extra bus round trip LeRobot makes here.
            present = self._last_state if self._last_state is not None else self.read_state()
            step = self.config.max_relative_target
            goal = np.clip(goal, present - step, present + step)
        ticks = self._norm.clamp_raw(self._norm.to_raw(goal))
        self._bus.sync_write(STS3215.GOAL_POSITION, dict(zip(joints.MOTOR_IDS, ticks.tolist(), strict=True)))

    def __enter__(self) -> Self:
        self.connect()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.disconnect()

    def _check_motors(self) -> None:
        label = self.config.arm.label
        missing = [mid for mid in joints.MOTOR_IDS if not self._bus.ping(mid)]
        if missing:
            names = [joints.MOTOR_NAMES[mid - 1] for mid in missing]
            raise ConnectionError(
                f"{label} on {self.config.port}: motor id(s) {missing} ({', '.join(names)}) did "
                "not answer; check the daisy chain, the power supply and the motor ids"
            )
        wrong = {
            mid: model
            for mid in joints.MOTOR_IDS
            if (model := self._bus.read(mid, STS3215.MODEL_NUMBER)) != STS3215.MODEL
        }
        if wrong:
            raise ConnectionError(
                f"{label} on {self.config.port}: expected STS3215 (model {STS3215.MODEL}) "
                f"motors, found model numbers {wrong}"
            )

    def _configure(self, calibrate: dict[str, tuple[int, int, int]]) -> None:
        bus = self._bus
        ids = joints.MOTOR_IDS
        # Torque off and EEPROM unlocked, as LeRobot's `torque_disabled()`, for the writes below.
        for mid in ids:
            bus.write(mid, STS3215.TORQUE_ENABLE, 0)
            bus.write(mid, STS3215.LOCK, 0)
        self._write_calibration(calibrate)
        for mid in ids:
            bus.write(mid, STS3215.RETURN_DELAY_TIME, 0)
            bus.write(mid, STS3215.MAXIMUM_ACCELERATION, 254)
            bus.write(mid, STS3215.ACCELERATION, 254)
            phase = bus.read(mid, STS3215.PHASE)
            if phase & 0x10:
                # Angle feedback mode 1 lets readings run negative past a turn.
                bus.write(mid, STS3215.PHASE, phase & ~0x10)
            bus.write(mid, STS3215.OPERATING_MODE, _POSITION_MODE)
            bus.write(mid, STS3215.P_COEFFICIENT, _P)
            bus.write(mid, STS3215.I_COEFFICIENT, _I)
            bus.write(mid, STS3215.D_COEFFICIENT, _D)
        gripper = ids[joints.GRIPPER_INDEX]
        for register, value in _GRIPPER_LIMITS:
            bus.write(gripper, register, value)
        # Hold the pose the arm is in: a stale goal would make it jump when torque comes on.
        present = bus.sync_read(STS3215.PRESENT_POSITION, ids, check_status=False)
        bus.sync_write(STS3215.GOAL_POSITION, present)
        self._torque_may_be_on = True
        for mid in ids:
            bus.write(mid, STS3215.TORQUE_ENABLE, 1)
            bus.write(mid, STS3215.LOCK, 1)

    def _differing_calibration(self) -> dict[str, tuple[int, int, int]]:
        """Motors whose stored (offset, min, max) are not the file's, LeRobot's ``is_calibrated`` test."""
        differing = {}
        for name, mid in zip(joints.MOTOR_NAMES, joints.MOTOR_IDS, strict=True):
            cal = self.calibration[name]
            stored = (
                self._bus.read(mid, STS3215.HOMING_OFFSET),
                self._bus.read(mid, STS3215.MIN_POSITION_LIMIT),
                self._bus.read(mid, STS3215.MAX_POSITION_LIMIT),
            )
            if stored != (cal.homing_offset, cal.range_min, cal.range_max):
                differing[name] = stored
        return differing

    def _mismatch_message(self, differing: dict[str, tuple[int, int, int]]) -> str:
        name, (offset, low, high) = next(iter(differing.items()))
        mid = joints.MOTOR_IDS[joints.MOTOR_NAMES.index(name)]
        cal = self.calibration[name]
        more = f" (and {len(differing) - 1} more motor(s))" if len(differing) > 1 else ""
        return (
            f"{self.config.arm.label} on {self.config.port}: motor {name} (id {mid}) holds homing_offset {offset}, "
            f"range {low}..{high}{more}, but {self.calibration_path} says homing_offset {cal.homing_offset}, range "
            f"{cal.range_min}..{cal.range_max}: if that file is this arm's, write it into the motors with "
            "--robot-opt write_calibration=true; otherwise give this arm's own id= or calibration="
        )

    def _write_calibration(self, differing: dict[str, tuple[int, int, int]]) -> None:
        # Reached only with write_calibration on: LeRobot asks before writing, servo needs the flag.
        for name, stored in differing.items():
            mid = joints.MOTOR_IDS[joints.MOTOR_NAMES.index(name)]
            cal = self.calibration[name]
            self._log.warning("writing calibration to motor", motor=name, motor_id=mid, was=stored)
            self._bus.write(mid, STS3215.HOMING_OFFSET, cal.homing_offset)
            self._bus.write(mid, STS3215.MIN_POSITION_LIMIT, cal.range_min)
            self._bus.write(mid, STS3215.MAX_POSITION_LIMIT, cal.range_max)

    def _close(self, *, disable_torque: bool) -> None:
        try:
            if disable_torque and self._bus.is_open:
                for mid in joints.MOTOR_IDS:
                    try:
                        self._bus.write(mid, STS3215.TORQUE_ENABLE, 0)
                        self._bus.write(mid, STS3215.LOCK, 0)
                    except FeetechError as exc:
                        # Keep going: the other motors should still be released.
                        self._log.error("could not disable torque", motor_id=mid, error=str(exc))
        finally:
            self._bus.close()

    def _note_status_errors(self) -> None:
        # Overload is routine while the gripper squeezes an object, so status bits are logged
        # when they change rather than raised in the control loop.
        errors = dict(self._bus.last_status_errors)
        if errors != self._reported_errors:
            self._log.warning(
                "motor status changed",
                errors={mid: describe_status_error(err) for mid, err in errors.items()},
            )
            self._reported_errors = errors

    def _check_calibration(self, cals: list[MotorCalibration]) -> None:
        for name, mid, cal in zip(joints.MOTOR_NAMES, joints.MOTOR_IDS, cals, strict=True):
            problem = None
            if cal.id != mid:
                problem = f"id is {cal.id}, but the {self.config.arm.label} has {name} on id {mid}"
            elif cal.range_max >= STS3215.RESOLUTION:
                problem = f"range_max {cal.range_max} exceeds {STS3215.RESOLUTION - 1}"
            elif abs(cal.homing_offset) >= 1 << 11:
                problem = f"homing_offset {cal.homing_offset} exceeds +-2047"
            if problem:
                raise CalibrationError(f"calibration file {self.calibration_path}: {name}: {problem}")

    def _build_spec(self, cals: list[MotorCalibration], modes: list[NormMode]) -> RobotSpec:
        ends = self._norm.to_units(np.array([[c.range_min for c in cals], [c.range_max for c in cals]]))
        lower, upper = ends.min(axis=0), ends.max(axis=0)
        # Speed limits are defined in degrees (percent for the gripper); rescale them for the
        # -100..100 mode by the units per tick of each joint.
        units_per_tick = (upper - lower) / np.array([c.range_max - c.range_min for c in cals])
        ticks_per_unit_nominal = np.array(
            [(STS3215.RESOLUTION - 1) / 360.0] * 5 + [(cals[-1].range_max - cals[-1].range_min) / 100.0]
        )
        max_velocity = np.asarray(joints.MAX_VELOCITY) * ticks_per_unit_nominal * units_per_tick
        degrees = JointNormalizer(cals, [NormMode.DEGREES] * 5 + [NormMode.RANGE_0_100])
        rest = self._norm.to_units(degrees.to_raw(np.asarray(joints.REST_POSE)))
        rest = np.clip(rest, lower, upper)
        return RobotSpec(
            name=self.config.arm.name,
            fps=self.config.fps,
            joint_names=joints.JOINT_NAMES,
            cameras={name: cam.spec for name, cam in self.config.cameras.items()},
            lower=tuple(float(v) for v in lower),
            upper=tuple(float(v) for v in upper),
            max_velocity=tuple(float(v) for v in max_velocity),
            rest_pose=tuple(float(v) for v in rest),
            extra={"port": self.config.port, "calibration": str(self.calibration_path)},
            units=tuple(mode.value for mode in modes),
        )
