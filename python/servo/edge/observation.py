"""What the control loop hands the engine every tick."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass
class ObservationInput:
    """What the robot saw: joint state, camera frames (RGB uint8), and when (monotonic ns).

    Made by the control-loop thread once per tick and handed to the engine by reference; the
    engine's worker reads it and never mutates it.
    """

    state: npt.NDArray[np.float32]
    images: dict[str, npt.NDArray[np.uint8]]
    mono_ns: int
    task: str = ""
