"""The contract between the edge runtime and a robot driver.

A driver is owned by the edge's control-loop thread: `read_state` and `send_action` are called
from that thread once per tick and must return within a small fraction of the tick. Camera frames
are produced by the driver's own capture threads; `read_cameras` only hands out the newest frame
each camera already has, so the control loop never waits on a camera.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

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


@runtime_checkable
class Robot(Protocol):
    """A position-controlled robot driven by the edge control loop.

    Owned by the control-loop thread; `connect`/`disconnect` may block (serial I/O, camera
    start-up) and are called off the event loop.
    """

    @property
    def spec(self) -> RobotSpec:
        """Static description of the robot."""
        ...

    def connect(self) -> None:
        """Open the hardware (bus, cameras) and start capture threads."""
        ...

    def disconnect(self) -> None:
        """Stop capture threads and release the hardware. Idempotent."""
        ...

    def read_state(self) -> FloatArray:
        """Current joint positions, float32 of shape (action_dim,)."""
        ...

    def read_cameras(self) -> dict[str, Frame]:
        """Newest frame of every camera (no waiting; frames must not be mutated by the caller)."""
        ...

    def send_action(self, target: FloatArray) -> None:
        """Command joint position targets (already clamped by the edge's safety layer)."""
        ...
