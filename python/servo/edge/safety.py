"""The last gate before the motors: joint limits and a slew-rate limit (seeds/004)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from servo.robots.protocol import RobotSpec

FloatArray = npt.NDArray[np.float32]


class SafetyLimiter:
    """Clamps targets into the joint limits and limits the change per tick.

    The slew limit applies to the *commanded* target, so a chunk that jumps (a bad merge, a
    different policy) becomes a ramp at ``max_velocity``, never a step. Owned by the control loop.
    """

    def __init__(self, spec: RobotSpec, *, velocity_scale: float = 1.0) -> None:
        if velocity_scale <= 0:
            raise ValueError(f"velocity_scale must be > 0, got {velocity_scale}")
        self.lower = np.asarray(spec.lower, dtype=np.float32)
        self.upper = np.asarray(spec.upper, dtype=np.float32)
        self.max_step = np.asarray(spec.max_velocity, dtype=np.float32) * np.float32(velocity_scale / spec.fps)
        self.last: FloatArray | None = None
        self.clamped_ticks = 0
        self.slewed_ticks = 0

    def start_from(self, position: FloatArray) -> None:
        """Anchor the slew limit on the measured position (before the first command)."""
        self.last = np.clip(np.asarray(position, dtype=np.float32), self.lower, self.upper)

    def apply(self, target: FloatArray) -> FloatArray:
        """The command to send for ``target``."""
        wanted = np.asarray(target, dtype=np.float32)
        out = np.clip(wanted, self.lower, self.upper)
        if not np.array_equal(out, wanted):
            self.clamped_ticks += 1
        if self.last is not None:
            step = np.clip(out - self.last, -self.max_step, self.max_step)
            slewed = self.last + step
            if not np.array_equal(slewed, out):
                self.slewed_ticks += 1
            out = slewed
        self.last = out.astype(np.float32)
        return self.last
