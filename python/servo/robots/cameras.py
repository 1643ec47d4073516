"""USB / V4L2 cameras through OpenCV, captured on their own threads.

OpenCV is an optional dependency (``pip install 'servo-robotics[cameras]'``) and is imported only when a
camera connects, so robots without cameras and the simulator never load it.
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from servo.errors import RobotError
from servo.logs import get_logger

from .capture import CaptureThread, LatestFrame
from .protocol import CameraSpec, Frame

_log = get_logger(__name__)


class CameraError(RobotError, RuntimeError):
    """A camera could not be opened or delivered no frame."""


def import_cv2() -> Any:
    """Import OpenCV, or explain how to install it.

    Raises:
        CameraError: OpenCV is not installed.
    """
    try:
        # Through importlib so type checking does not depend on OpenCV being installed.
        return importlib.import_module("cv2")
    except ImportError as exc:
        raise CameraError("OpenCV cameras need opencv-python-headless: pip install 'servo-robotics[cameras]'") from exc


@dataclass(frozen=True)
class OpenCVCameraConfig:
    """One OpenCV camera; immutable.

    Attributes:
        index_or_path: Device index (``0`` for ``/dev/video0``) or a device/video file path.
        width: Requested frame width in pixels.
        height: Requested frame height in pixels.
        fps: Requested frame rate.
    """

    index_or_path: int | str
    width: int = 640
    height: int = 480
    fps: float = 30.0

    @property
    def spec(self) -> CameraSpec:
        """The `CameraSpec` frames from this camera satisfy."""
        return CameraSpec(height=self.height, width=self.width, fps=self.fps)


class OpenCVCamera:
    """A camera read through ``cv2.VideoCapture`` on a dedicated capture thread.

    `connect` and `disconnect` are called by the owning thread (the robot's control-loop thread).
    The capture thread owns the ``VideoCapture`` from then on: it reads, converts BGR to RGB once
    and publishes into a latest-frame slot, and releases the device when it stops. `latest` may be
    called from any thread.
    """

    def __init__(
        self,
        index_or_path: int | str,
        width: int = 640,
        height: int = 480,
        fps: float = 30.0,
        *,
        name: str = "camera",
        first_frame_timeout_s: float = 5.0,
    ) -> None:
        """Describe the camera; nothing is opened until `connect`.

        Args:
            index_or_path: Device index or path (a video file works too, looping).
            width: Requested width; frames of another size are an error at connect.
            height: Requested height.
            fps: Requested frame rate.
            name: Name used for the thread and logs.
            first_frame_timeout_s: How long `connect` waits for the first frame.
        """
        self.config = OpenCVCameraConfig(index_or_path, width, height, fps)
        self.name = name
        self.first_frame_timeout_s = first_frame_timeout_s
        self._slot = LatestFrame()
        self._thread: CaptureThread | None = None
        self._log = _log.bind(camera=name, source=str(index_or_path))

    @classmethod
    def from_config(cls, config: OpenCVCameraConfig, name: str = "camera") -> OpenCVCamera:
        """Build a camera from its config."""
        return cls(config.index_or_path, config.width, config.height, config.fps, name=name)

    @property
    def is_connected(self) -> bool:
        """Whether the capture thread is running."""
        return self._thread is not None and self._thread.is_alive

    def connect(self) -> None:
        """Open the device, start capturing and wait for the first frame. Idempotent.

        Raises:
            CameraError: OpenCV is missing, the device does not open, or it delivers no frame
                (or frames of the wrong size) within ``first_frame_timeout_s``.
        """
        if self._thread is not None:
            return
        cv2 = import_cv2()
        cfg = self.config
        capture = cv2.VideoCapture(cfg.index_or_path)
        if not capture.isOpened():
            capture.release()
            raise CameraError(f"camera {self.name!r}: cannot open {cfg.index_or_path!r}")
        capture.set(cv2.CAP_PROP_FRAME_WIDTH, cfg.width)
        capture.set(cv2.CAP_PROP_FRAME_HEIGHT, cfg.height)
        capture.set(cv2.CAP_PROP_FPS, cfg.fps)
        seen = self._slot.seq
        # A device blocks in read() until its next frame; a video file would be decoded as fast
        # as the CPU allows, so it is paced at the requested rate instead.
        is_file = isinstance(cfg.index_or_path, str) and os.path.isfile(cfg.index_or_path)
        self._thread = CaptureThread(
            self.name,
            functools.partial(_grab, cv2, capture),
            self._slot,
            owner=self,
            period_s=1.0 / cfg.fps if is_file else None,
            on_exit=capture.release,
        )
        self._thread.start()
        frame = self._slot.wait(seen, self.first_frame_timeout_s)
        problem = None
        if frame is None:
            problem = f"no frame within {self.first_frame_timeout_s} s"
        elif frame.shape != (cfg.height, cfg.width, 3):
            problem = f"frames are {frame.shape}, expected {(cfg.height, cfg.width, 3)}"
        if problem is not None:
            self.disconnect()
            raise CameraError(f"camera {self.name!r} ({cfg.index_or_path!r}): {problem}")
        self._log.info("camera connected", width=cfg.width, height=cfg.height, fps=cfg.fps)

    def disconnect(self) -> None:
        """Stop the capture thread, which releases the device. Idempotent."""
        if self._thread is None:
            return
        self._thread.stop()
        self._thread = None
        self._log.info("camera disconnected")

    def latest(self) -> Frame | None:
        """Newest RGB frame, or ``None`` before the first one; never waits."""
        return self._slot.latest()

    def wait_for_frame(self, timeout_s: float = 1.0) -> Frame | None:
        """Block until a frame newer than the current one arrives (start-up and tests only)."""
        return self._slot.wait(self._slot.seq, timeout_s)


def _grab(cv2: Any, capture: Any) -> Frame | None:
    ok, bgr = capture.read()
    if not ok:
        # A video file has ended: rewind, so a file stands in for a live camera.
        if capture.get(cv2.CAP_PROP_FRAME_COUNT) > 0:
            capture.set(cv2.CAP_PROP_POS_FRAMES, 0)
        return None
    rgb: Frame = np.ascontiguousarray(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    return rgb


class CameraGroup:
    """Named OpenCV cameras as one `Cameras`: a real robot's cameras in the edge's main process.

    `connect` and `disconnect` are called by the owner; `read_cameras` from any thread.
    """

    def __init__(self, cameras: dict[str, OpenCVCamera]) -> None:
        self.cameras = cameras

    def connect(self) -> None:
        """Connect every camera; on a failure the ones already connected are released again.

        Raises:
            CameraError: a camera did not open or delivered no (or wrongly sized) frames.
        """
        try:
            for camera in self.cameras.values():
                camera.connect()
        except BaseException:
            self.disconnect()
            raise

    def disconnect(self) -> None:
        """Disconnect every camera. Idempotent."""
        for camera in self.cameras.values():
            camera.disconnect()

    def read_cameras(self) -> dict[str, Frame]:
        """Newest frame of every camera, without waiting."""
        frames: dict[str, Frame] = {}
        for name, camera in self.cameras.items():
            frame = camera.latest()
            if frame is not None:
                frames[name] = frame
        return frames
