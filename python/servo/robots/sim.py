"""Simulated arm: first-order joint dynamics (its cameras: `servo.robots.sim_cameras`).

By default it is an SO-100 follower: units and feature names are LeRobot's ``so100_follower``
with ``use_degrees=True`` (see `servo.robots.so100_joints`), so policies and recorded datasets
line up with the real arm. Given other joint names (`SimJoints.generic`: a policy's action
names), it is an arm of that many joints with limits from their units; its cameras still draw
the SO-100, posed from the first joints.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

import numpy as np
import numpy.typing as npt

from servo.logs import get_logger

from . import so100_joints as joints
from .protocol import CameraSpec, FloatArray, RobotSpec

_log = get_logger(__name__)

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class SimCameraConfig:
    """One simulated camera: name, frame size in pixels and frame rate. Immutable, shareable."""

    name: str
    height: int = 480
    width: int = 640
    fps: float = 30.0


def _default_cameras() -> tuple[SimCameraConfig, ...]:
    return (SimCameraConfig("front"), SimCameraConfig("wrist"))


#: A generic joint's range by its unit (lower, upper); undeclared units get the widest.
UNIT_RANGES: dict[str, tuple[float, float]] = {
    "degrees": (-180.0, 180.0),
    "radians": (-math.pi, math.pi),
    "meters": (-1.0, 1.0),
    "range_0_100": (0.0, 100.0),
    "range_m100_100": (-100.0, 100.0),
    "": (-1000.0, 1000.0),
}


@dataclass(frozen=True)
class SimJoints:
    """The simulated arm's joint table: names, units, limits, speed and rest pose. Immutable."""

    names: tuple[str, ...] = joints.JOINT_NAMES
    units: tuple[str, ...] = joints.UNITS_DEGREES
    lower: tuple[float, ...] = joints.LOWER
    upper: tuple[float, ...] = joints.UPPER
    max_velocity: tuple[float, ...] = joints.MAX_VELOCITY
    rest_pose: tuple[float, ...] = joints.REST_POSE

    @classmethod
    def generic(cls, names: tuple[str, ...], units: tuple[str, ...] = ()) -> SimJoints:
        """An arm of these joints: range by unit (`UNIT_RANGES`), a full range per second, rest mid-range.

        ``units``: one per joint, or empty (undeclared); an unknown unit gets the widest range.

        Raises:
            ValueError: no names, duplicate names, or a count of units that is not one per joint.
        """
        _require(bool(names) and len(set(names)) == len(names), f"joint names must be unique, got {list(names)}")
        _require(not units or len(units) == len(names), f"{len(units)} units for {len(names)} joints")
        if names == joints.JOINT_NAMES and (not units or units == joints.UNITS_DEGREES):
            return cls()
        ranges = [UNIT_RANGES.get(unit, UNIT_RANGES[""]) for unit in units or ("",) * len(names)]
        return cls(
            names=names,
            units=tuple(units),
            lower=tuple(lo for lo, _ in ranges),
            upper=tuple(hi for _, hi in ranges),
            max_velocity=tuple(hi - lo for lo, hi in ranges),
            rest_pose=tuple((lo + hi) / 2 for lo, hi in ranges),
        )

    @property
    def is_so100(self) -> bool:
        """Whether this is the SO-100's own table (its cameras draw the pose as it is)."""
        return self == SimJoints()

    def drawn_pose(self, pose: npt.ArrayLike) -> F64:
        """The SO-100 pose the cameras draw for ``pose``.

        Each of the first five joints swings its arm joint by up to 90 degrees across its range; a
        sixth or later last joint opens the gripper.
        """
        q = np.asarray(pose, dtype=np.float64)
        if self.is_so100:
            return q
        lower, upper = np.asarray(self.lower), np.asarray(self.upper)
        unit = np.clip((q - lower) / (upper - lower), 0.0, 1.0)  # 0..1 across each range
        drawn = np.asarray(joints.REST_POSE, dtype=np.float64)
        arm = min(len(q) - (1 if len(q) >= 6 else 0), 5)
        drawn[:arm] += (unit[:arm] - 0.5) * 180.0
        if len(q) >= 6:
            drawn[joints.GRIPPER_INDEX] = unit[-1] * 100.0
        return drawn


@dataclass(frozen=True)
class SimConfig:
    """Knobs of the simulated arm; immutable, so any thread may read it.

    Attributes:
        fps: Control rate advertised in the spec.
        cameras: Simulated cameras; empty for none.
        joints: The joint table (default: the SO-100's).
        time_constant_s: Time constant of each joint's first-order response to its target.
        max_velocity: Per-joint speed limit of the simulated servos (units per second; default:
            the joint table's).
        noise_std: Standard deviation of Gaussian noise added to every `read_state` (units).
        seed: Seed of the sensor noise and of the rendered textures.
        initial_pose: Joint positions (and target) at construction (default: the rest pose).
        realtime: Advance the dynamics by the monotonic time elapsed since the last call; with
            ``False`` only `SimSO100.step` moves the arm, for deterministic tests.
        first_frame_timeout_s: How long `SimCameras.connect` waits for every camera's first frame.
    """

    fps: float = 30.0
    cameras: tuple[SimCameraConfig, ...] = field(default_factory=_default_cameras)
    time_constant_s: float = 0.075
    max_velocity: tuple[float, ...] = ()
    noise_std: float = 0.0
    seed: int = 0
    initial_pose: tuple[float, ...] = ()
    realtime: bool = True
    first_frame_timeout_s: float = 2.0
    joints: SimJoints = field(default_factory=SimJoints)

    def __post_init__(self) -> None:
        table = self.joints
        # Frozen: the defaults that depend on the joint table are filled in once, here.
        object.__setattr__(self, "max_velocity", tuple(self.max_velocity or table.max_velocity))
        object.__setattr__(self, "initial_pose", tuple(self.initial_pose or table.rest_pose))
        n = len(table.names)
        _require(self.fps > 0, f"fps must be positive, got {self.fps}")
        _require(
            self.time_constant_s > 0,
            f"time_constant_s must be positive, got {self.time_constant_s}",
        )
        _require(self.noise_std >= 0, f"noise_std must be >= 0, got {self.noise_std}")
        _require(len(self.max_velocity) == n, f"max_velocity needs {n} values")
        _require(all(v > 0 for v in self.max_velocity), "max_velocity values must be positive")
        _require(len(self.initial_pose) == n, f"initial_pose needs {n} values")
        outside = [
            name
            for name, q, lo, hi in zip(table.names, self.initial_pose, table.lower, table.upper, strict=True)
            if not lo <= q <= hi
        ]
        _require(not outside, f"initial_pose is outside the joint limits for {outside}")
        names = [cam.name for cam in self.cameras]
        _require(len(set(names)) == len(names), f"camera names must be unique, got {names}")
        for cam in self.cameras:
            _require(
                cam.height > 0 and cam.width > 0 and cam.fps > 0,
                f"camera {cam.name!r} needs a positive size and fps",
            )


def first_order_step(position: F64, target: F64, dt: float, time_constant_s: float, max_velocity: F64) -> F64:
    """Advance a rate-limited first-order lag by ``dt`` seconds, exactly.

    Solves ``dx/dt = clip((target - x) / tau, -v_max, v_max)`` in closed form, so the result does
    not depend on how the elapsed time is sliced: a loop at 5 Hz and one at 500 Hz see the same
    trajectory.

    Args:
        position: Current positions.
        target: Commanded positions (held constant over ``dt``).
        dt: Elapsed time in seconds, >= 0.
        time_constant_s: First-order time constant ``tau``.
        max_velocity: Per-joint speed limit ``v_max``, > 0.

    Returns:
        Positions after ``dt``.
    """
    error = target - position
    size = np.abs(error)
    # Below this error the proportional speed error/tau is under the limit.
    knee = max_velocity * time_constant_s
    saturated_for = np.maximum(size - knee, 0.0) / max_velocity
    still_saturated = size - max_velocity * dt
    decayed = np.minimum(size, knee) * np.exp(-np.maximum(dt - saturated_for, 0.0) / time_constant_s)
    remaining = np.where(dt < saturated_for, still_saturated, decayed)
    result: F64 = target - np.sign(error) * remaining
    return result


class SimSO100:
    """The joints of a simulated arm (an SO-100 follower unless given other joints), implementing `Robot`.

    Owned by the control-loop thread: `read_state`, `send_action` and `step` advance and command
    the joint dynamics on that thread. Its cameras (`servo.robots.sim_cameras.SimCameras`) render
    the pose the control loop publishes; in one process the arm itself is that `PoseSource`.
    """

    def __init__(self, config: SimConfig | None = None) -> None:
        """Create the simulator.

        Args:
            config: Simulation knobs; defaults to `SimConfig()`.
        """
        self.config = config or SimConfig()
        cfg = self.config
        table = cfg.joints
        self._spec = RobotSpec(
            name="sim",
            fps=cfg.fps,
            joint_names=table.names,
            cameras={c.name: CameraSpec(height=c.height, width=c.width, fps=c.fps) for c in cfg.cameras},
            lower=table.lower,
            upper=table.upper,
            max_velocity=tuple(cfg.max_velocity),
            rest_pose=table.rest_pose,
            extra={"arm": "so100" if table.is_so100 else f"{len(table.names)} joints"},
            units=table.units,
        )
        self._lower = np.asarray(table.lower, dtype=np.float64)
        self._upper = np.asarray(table.upper, dtype=np.float64)
        self._vmax = np.asarray(cfg.max_velocity, dtype=np.float64)
        self._position = np.asarray(cfg.initial_pose, dtype=np.float64)
        self._target = self._position.copy()
        self._rng = np.random.default_rng(cfg.seed)
        self._pose = self._frozen(self._position)
        self._last_t = time.monotonic()
        self._connected = False
        self._log = _log.bind(robot="sim")

    @property
    def spec(self) -> RobotSpec:
        """Static description of the simulated arm."""
        return self._spec

    @property
    def is_connected(self) -> bool:
        """Whether `connect` has run and `disconnect` has not."""
        return self._connected

    @property
    def position(self) -> F64:
        """True (noise-free) joint positions, a copy."""
        return self._position.copy()

    @property
    def target(self) -> F64:
        """Current commanded target, a copy."""
        return self._target.copy()

    def latest_pose(self) -> FloatArray:
        """True (noise-free) joint positions, read-only float32 (the `PoseSource` of its cameras)."""
        return self._pose

    def connect(self) -> None:
        """Start the dynamics clock. Idempotent."""
        if self._connected:
            return
        self._last_t = time.monotonic()
        self._connected = True
        self._log.info("connected")

    def disconnect(self) -> None:
        """Stop taking commands. Idempotent."""
        if not self._connected:
            return
        self._connected = False
        self._log.info("disconnected")

    def read_state(self) -> FloatArray:
        """Joint positions (plus sensor noise if configured), float32, one per joint."""
        self._require_connected("read_state")
        if self.config.realtime:
            self._advance_to_now()
        state = self._position
        if self.config.noise_std > 0:
            state = state + self._rng.normal(0.0, self.config.noise_std, size=state.shape)
        return state.astype(np.float32)

    def send_action(self, target: FloatArray) -> None:
        """Set the joint targets, clamped to the joint limits like a servo's position limits.

        Raises:
            ValueError: If ``target`` has the wrong shape or is not finite.
        """
        self._require_connected("send_action")
        goal = np.asarray(target, dtype=np.float64)
        if goal.shape != self._position.shape:
            raise ValueError(f"target has shape {goal.shape}, expected {self._position.shape}")
        if not np.all(np.isfinite(goal)):
            raise ValueError(f"target has non-finite values: {goal.tolist()}")
        if self.config.realtime:
            # The old target governed the motion up to now; the new one applies from now on.
            self._advance_to_now()
        self._target = np.clip(goal, self._lower, self._upper)

    def step(self, dt: float) -> None:
        """Advance the dynamics by exactly ``dt`` seconds (deterministic; for tests).

        Meant for ``realtime=False``; with ``realtime=True`` it adds ``dt`` on top of real time.
        Works whether or not the simulator is connected.
        """
        if dt < 0 or not math.isfinite(dt):
            raise ValueError(f"dt must be a finite non-negative number, got {dt}")
        self._advance(dt)

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

    def _advance_to_now(self) -> None:
        now = time.monotonic()
        dt = now - self._last_t
        self._last_t = now
        self._advance(dt)

    def _advance(self, dt: float) -> None:
        self._position = first_order_step(self._position, self._target, dt, self.config.time_constant_s, self._vmax)
        self._pose = self._frozen(self._position)

    @staticmethod
    def _frozen(pose: F64) -> FloatArray:
        # Replaced, never mutated: a camera thread reading it sees one consistent pose.
        snapshot = pose.astype(np.float32)
        snapshot.flags.writeable = False
        return snapshot

    def _require_connected(self, what: str) -> None:
        if not self._connected:
            raise RuntimeError(f"SimSO100.{what} called before connect()")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"SimConfig: {message}")
