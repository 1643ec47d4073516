"""The last gate before the motors (docs/design/control-loop.md §4): no non-finite target, joint limits, slew rate."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from servo.errors import RobotError
from servo.robots.protocol import RobotSpec

FloatArray = npt.NDArray[np.float32]


class UnsafeTarget(RobotError, ValueError):
    """A target the safety layer refuses to turn into a command (no clamp can fix NaN)."""


class SafetyLimiter:
    """Refuses non-finite targets, clamps into the joint limits and limits the change per tick.

    The slew limit applies to the *commanded* target, so a chunk that jumps (a bad merge, a
    different policy) becomes a ramp at ``max_velocity``, never a step. A refused target leaves
    the last command in place: the caller holds it. Owned by the control loop.
    """

    def __init__(self, spec: RobotSpec, *, velocity_scale: float = 1.0) -> None:
        if velocity_scale <= 0:
            raise ValueError(f"velocity_scale must be > 0, got {velocity_scale}")
        self.lower = np.asarray(spec.lower, dtype=np.float32)
        self.upper = np.asarray(spec.upper, dtype=np.float32)
        self.max_step = np.asarray(spec.max_velocity, dtype=np.float32) * np.float32(velocity_scale / spec.fps)
        self._min_step = -self.max_step
        self.last: FloatArray | None = None
        self.clamped_ticks = 0
        self.slewed_ticks = 0

    def start_from(self, position: FloatArray) -> None:
        """Anchor the slew limit on the measured position (before the first command)."""
        self.last = np.clip(np.asarray(position, dtype=np.float32), self.lower, self.upper)

    def resume_from(self, position: FloatArray) -> bool:
        """Anchor again after the robot's state was lost for a while; True when the last command stays.

        The arm held the last command meanwhile (a controller keeps its last target). If it is
        within one slew step of it, the ramp goes on from the last command, so consecutive commands
        stay within the slew limit for a controller that checks them; otherwise (the arm was moved,
        or never got there) it starts from where the arm is measured, never with a jump from it.
        """
        measured = np.clip(np.asarray(position, dtype=np.float32), self.lower, self.upper)
        if self.last is not None and bool(np.all(np.abs(measured - self.last) <= self.max_step)):
            return True
        self.last = measured
        return False

    def apply(self, target: FloatArray) -> FloatArray:
        """The command to send for ``target``.

        Raises:
            UnsafeTarget: ``target`` has the wrong shape or a non-finite value, or the command
                would be non-finite (a non-finite anchor). Nothing changes: hold the last command.
        """
        wanted = np.asarray(target, dtype=np.float32)
        if wanted.shape != self.lower.shape:
            raise UnsafeTarget(f"target has shape {wanted.shape}, expected {self.lower.shape}")
        if not np.isfinite(wanted).all():
            raise UnsafeTarget(f"target has non-finite values {wanted.tolist()}")
        out = np.clip(wanted, self.lower, self.upper)
        clamped = not np.array_equal(out, wanted)
        slewed = False
        if self.last is not None:
            step = np.clip(out - self.last, self._min_step, self.max_step)
            limited = self.last + step
            slewed = not np.array_equal(limited, out)
            out = limited
        if not np.isfinite(out).all():
            raise UnsafeTarget(f"command would be non-finite {out.tolist()} (last command {self.last})")
        self.clamped_ticks += clamped
        self.slewed_ticks += slewed
        self.last = out  # a fresh float32 array (clip's or the sum's): nobody else holds it
        return out
