"""The simulated arm's cameras: each renders the newest published joint state on its own thread.

They live in the edge's main process while the simulated joints live in the control process:
the pose they render comes from a `PoseSource` (the pose the control loop published, or, in a
single process, the `SimSO100` itself).
"""

from __future__ import annotations

import functools
import time

import numpy as np

from servo.logs import get_logger

from .capture import CaptureThread, LatestFrame, newest_frames
from .protocol import FloatArray, Frame, PoseSource
from .sim import SimConfig, SimJoints
from .sim_render import ArmRenderer, view_for

_log = get_logger(__name__)


def _render(renderer: ArmRenderer, poses: PoseSource, fallback: FloatArray, joints: SimJoints) -> Frame:
    pose = poses.latest_pose()
    return renderer.render(joints.drawn_pose(fallback if pose is None else pose))


class SimCameras:
    """The cameras of `SimConfig`, implementing the `Cameras` protocol.

    `connect` and `disconnect` are called by the owner (the edge's main process); each camera
    renders on its own capture thread at its own fps into a latest-frame slot, and `read_cameras`
    may be called from any thread.

    Args:
        config: The simulated arm's configuration (its ``cameras``, ``seed``, ``initial_pose``).
        poses: Where the pose to render comes from; the initial pose is drawn until it has one.
    """

    def __init__(self, config: SimConfig, poses: PoseSource) -> None:
        self.config = config
        self._poses = poses
        self._slots: dict[str, LatestFrame] = {}
        self._threads: list[CaptureThread] = []

    def connect(self) -> None:
        """Start the camera threads and wait for each camera's first frame. Idempotent.

        Raises:
            RuntimeError: a camera produced no frame within ``first_frame_timeout_s``.
        """
        if self._threads:
            return
        fallback = np.asarray(self.config.initial_pose, dtype=np.float32)
        try:
            for index, cam in enumerate(self.config.cameras):
                renderer = ArmRenderer(cam.height, cam.width, view_for(cam.name, index), seed=self.config.seed + index)
                slot = LatestFrame()
                thread = CaptureThread(
                    cam.name,
                    functools.partial(_render, renderer, self._poses, fallback, self.config.joints),
                    slot,
                    owner=self,
                    period_s=1.0 / cam.fps,
                )
                self._slots[cam.name] = slot
                self._threads.append(thread)
                thread.start()
            for name, slot in self._slots.items():
                if slot.wait(0, self.config.first_frame_timeout_s) is None:
                    raise RuntimeError(
                        f"simulated camera {name!r} produced no frame within {self.config.first_frame_timeout_s} s"
                    )
        except BaseException:
            self.disconnect()
            raise
        if self._slots:
            _log.info("cameras connected", cameras=list(self._slots))

    def disconnect(self) -> None:
        """Stop and join the camera threads. Idempotent."""
        for thread in self._threads:
            thread.stop()
        self._threads.clear()
        self._slots.clear()

    def read_cameras(self) -> dict[str, Frame]:
        """Newest rendered frame of every camera, without waiting."""
        return newest_frames(self._slots)

    def wait_for_frames(self, timeout_s: float = 1.0) -> dict[str, Frame]:
        """One frame per camera, each rendered entirely after this call began.

        For start-up and tests; the edge uses `read_cameras`, which never waits.

        Raises:
            TimeoutError: A camera produced no such frame within ``timeout_s``.
        """
        seen = {name: slot.seq for name, slot in self._slots.items()}
        deadline = time.monotonic() + timeout_s
        frames: dict[str, Frame] = {}
        for name, slot in self._slots.items():
            # The frame being rendered at the call may still show the old pose; the next cannot.
            frame = slot.wait(seen[name] + 1, max(deadline - time.monotonic(), 0.0))
            if frame is None:
                raise TimeoutError(f"simulated camera {name!r} produced no frame in {timeout_s} s")
            frames[name] = frame
        return frames
