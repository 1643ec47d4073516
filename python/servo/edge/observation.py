"""What the engine knows of the robot: the newest observation, how it gets it, and the robot's features."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from servo.robots.protocol import RobotSpec
from servo.wire import CameraFeature, Features


@dataclass
class ObservationInput:
    """What the robot saw: joint state, camera frames (RGB uint8), when, and where its plan stood.

    Assembled in the edge's main process from the state the control loop published and the
    cameras' newest frames; the engine's worker reads it and never mutates it. ``tick`` and
    ``position`` are the control loop's, taken with the state before that tick's action: a chunk
    computed from this observation is meant for the steps from ``tick`` on, and its merge skips
    exactly the actions taken since ``position`` (`servo._core.ActionQueue.get_position`).
    """

    state: npt.NDArray[np.float32]
    images: dict[str, npt.NDArray[np.uint8]]
    #: Monotonic time (ns) of the tick that read the state.
    mono_ns: int
    #: That tick's number.
    tick: int
    #: The action queue's position before that tick took its action.
    position: int
    task: str = ""


class ObservationFeed(Protocol):
    """Where an engine's worker gets observations: the control loop (`servo.edge.control_loop`)."""

    def latest(self) -> ObservationInput | None:
        """The newest observation, or None before the control loop's first tick."""
        ...

    async def wait(self, queue_below: int, timeout: float) -> None:
        """Return once the control loop saw fewer than ``queue_below`` queued actions, or after ``timeout`` s."""
        ...


def robot_features(spec: RobotSpec) -> Features:
    """The feature contract a robot offers to a policy."""
    names = list(spec.joint_names)
    return Features(
        state_names=names,
        action_names=names,
        cameras={name: CameraFeature(cam.height, cam.width) for name, cam in spec.cameras.items()},
        state_units=list(spec.units),
        action_units=list(spec.units),
    )
