"""The contract between the edge runtime and a robot driver: joints and cameras, apart.

A robot is two halves that live in different processes (`Robot` used to be one object with
``read_cameras``; the cameras moved out so camera work never shares a process with the tick):

* `Robot` — the joints. Owned by the edge's control loop (the control process, or the control
  thread of the sequential engine), which builds it from a `servo.robots.RobotDescription`:
  `read_state` and `send_action` are called once per tick and must return within a small
  fraction of it.
* `Cameras` — owned by the edge's main process. Each camera's capture thread drops its newest
  frame into a slot; `read_cameras` hands the newest frames out without waiting. A simulated
  camera renders the newest joint state the control loop published (a `PoseSource`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from servo.errors import RobotError

FloatArray = npt.NDArray[np.float32]
Frame = npt.NDArray[np.uint8]


@dataclass(frozen=True)
class CameraSpec:
    """One camera: frames are RGB uint8 arrays of shape (height, width, 3)."""

    height: int
    width: int
    fps: float = 30.0


@dataclass(frozen=True)
class RobotSpec:
    """What the edge needs to know about a robot to drive it safely.

    Attributes:
        name: Robot type, e.g. ``"so100"``.
        fps: Control rate the loop runs at.
        joint_names: Ordered feature names of the state and action vectors
            (LeRobot style, e.g. ``"shoulder_pan.pos"``).
        cameras: Camera name -> spec.
        lower: Per-joint lower position limit (same units as the state).
        upper: Per-joint upper position limit.
        max_velocity: Per-joint slew limit in units per second; the control loop clamps the
            change of the commanded target to ``max_velocity / fps`` per tick.
        rest_pose: Pose the robot is driven to before it disconnects.
        units: Unit of each joint's value (``degrees``, ``range_m100_100``, ``range_0_100``: LeRobot's
            motor normalisation modes), checked against the policy's at session open; empty when
            the driver does not declare them.
    """

    name: str
    fps: float
    joint_names: tuple[str, ...]
    cameras: Mapping[str, CameraSpec]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    max_velocity: tuple[float, ...]
    rest_pose: tuple[float, ...]
    extra: Mapping[str, str] = field(default_factory=dict)
    units: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.joint_names)
        declared = ("units",) if self.units else ()
        for name in ("lower", "upper", "max_velocity", "rest_pose", *declared):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"RobotSpec.{name} has {len(getattr(self, name))} values, expected one per joint ({n})"
                )

    @property
    def action_dim(self) -> int:
        """Number of joints (= length of state and action vectors)."""
        return len(self.joint_names)


class RobotFault(RobotError, RuntimeError):
    """`Robot.read_state` has no usable state to give (a remote robot's joint states stopped arriving).

    The control loop then commands nothing (the robot holds its last target), reports a fault
    once, and takes the next fresh state as the new anchor of its slew limit, so the park that
    follows starts from where the robot really is.
    """


@runtime_checkable
class Robot(Protocol):
    """The joints of a position-controlled robot, driven by the edge control loop.

    Owned by the control loop's thread; `connect`/`disconnect` may block (serial I/O) and are
    called by that thread before the first and after the last tick.
    """

    @property
    def spec(self) -> RobotSpec:
        """Static description of the robot (joints, limits, rate, and its cameras)."""
        ...

    def connect(self) -> None:
        """Open the hardware (bus) and make the joints hold their pose."""
        ...

    def disconnect(self) -> None:
        """Release the hardware. Idempotent."""
        ...

    def read_state(self) -> FloatArray:
        """Current joint positions, float32 of shape (action_dim,).

        Raises:
            RobotFault: no fresh state (e.g. a remote robot's states are older than its bound).
        """
        ...

    def send_action(self, target: FloatArray) -> None:
        """Command joint position targets (already checked and clamped by the edge's safety layer)."""
        ...


@runtime_checkable
class Cameras(Protocol):
    """A robot's cameras, owned by the edge's main process (capture runs on their own threads)."""

    def connect(self) -> None:
        """Start capturing; returns once every camera delivered a frame."""
        ...

    def disconnect(self) -> None:
        """Stop capturing and release the devices. Idempotent."""
        ...

    def read_cameras(self) -> dict[str, Frame]:
        """Newest frame of every camera (no waiting; frames must not be mutated by the caller)."""
        ...


class PoseSource(Protocol):
    """Where simulated cameras get the joint state to render (any thread may ask)."""

    def latest_pose(self) -> FloatArray | None:
        """Newest joint positions, or None before the first one."""
        ...


class NoCameras:
    """The `Cameras` of a robot without any. Stateless."""

    def connect(self) -> None:
        """Nothing to start."""

    def disconnect(self) -> None:
        """Nothing to stop."""

    def read_cameras(self) -> dict[str, Frame]:
        """No frames."""
        return {}


@dataclass(frozen=True)
class RobotParts:
    """What a robot factory returns: the joints, and how to build the cameras if it has any. Immutable.

    Attributes:
        joints: The joints (not connected).
        cameras: Builds the cameras (not connected) in the edge's main process; simulated
            cameras render the poses the given `PoseSource` publishes, real ones ignore it.
            None for a robot without cameras.
    """

    joints: Robot
    cameras: Callable[[PoseSource], Cameras] | None = None
