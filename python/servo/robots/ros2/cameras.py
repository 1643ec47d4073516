"""A ROS 2 robot's cameras, each read on its own capture thread in the edge's main process.

Topics carry ``sensor_msgs/Image`` (rgb8, bgr8) or ``sensor_msgs/CompressedImage`` (JPEG). Each
camera's thread blocks on its reader (a wait that releases the GIL) until a message arrives,
decodes the newest one to an RGB array and drops it into the camera's latest-frame slot;
`read_cameras` never waits. A message that cannot be a frame of the declared size (another
encoding, a truncated buffer, a corrupt JPEG) is dropped and logged, never handed to the policy.
"""

from __future__ import annotations

import functools

import numpy as np
import simplejpeg

from servo.errors import RobotError
from servo.logs import get_logger

from ..capture import CaptureThread, LatestFrame, newest_frames
from ..protocol import Frame
from .link import Link, Reader, open_link
from .messages import CompressedImage, Image
from .options import CameraTopic, Ros2Setup

_log = get_logger(__name__)

#: How long a camera may be silent before the capture loop says so (and looks at its stop flag).
_WAIT_S = 0.5


class FrameError(RobotError, ValueError):
    """A message that is not a frame of the camera's declared size and a supported encoding."""


def decode(message: Image | CompressedImage, height: int, width: int) -> Frame:
    """An RGB uint8 frame of shape (height, width, 3) from an Image or CompressedImage.

    Raises:
        FrameError: another size, an unsupported encoding, too little data, or a corrupt JPEG.
    """
    if isinstance(message, CompressedImage):
        return _decode_compressed(message, height, width)
    if (message.height, message.width) != (height, width):
        raise FrameError(f"frame is {message.width}x{message.height}, declared {width}x{height}")
    if message.encoding not in ("rgb8", "bgr8"):
        raise FrameError(f"encoding {message.encoding!r} is not rgb8 or bgr8")
    row = 3 * width
    if message.step < row or len(message.data) < message.step * (height - 1) + row:
        raise FrameError(f"{len(message.data)} bytes with step {message.step} cannot hold {width}x{height} rgb8")
    rows = np.frombuffer(message.data, np.uint8, count=message.step * (height - 1) + row)
    pixels = np.lib.stride_tricks.as_strided(rows, (height, width, 3), (message.step, 3, 1))
    frame: Frame = np.ascontiguousarray(pixels if message.encoding == "rgb8" else pixels[..., ::-1])
    return frame


def _decode_compressed(message: CompressedImage, height: int, width: int) -> Frame:
    # image_transport writes "<raw encoding>; jpeg compressed <encoding the JPEG was made from>";
    # a JPEG made from rgb8 bytes (as OpenCV's BGR) comes out with red and blue swapped.
    kind = message.format.lower()
    if "png" in kind:
        raise FrameError(f"format {message.format!r}: only JPEG is decoded; publish JPEG (format jpeg)")
    try:
        frame: Frame = simplejpeg.decode_jpeg(message.data, colorspace="RGB")
    except ValueError as exc:
        raise FrameError(f"not a JPEG ({exc})") from None
    if frame.shape != (height, width, 3):
        raise FrameError(f"frame is {frame.shape[1]}x{frame.shape[0]}, declared {width}x{height}")
    if "compressed rgb8" in kind:
        frame = np.ascontiguousarray(frame[..., ::-1])
    return frame


def _grab(reader: Reader, camera: CameraTopic, errors: list[int]) -> Frame | None:
    """Wait for the camera's next message and decode the newest; None when none came or it was bad."""
    if not reader.wait(_WAIT_S):
        return None
    samples = [s for s in reader.take(8) if isinstance(s, Image | CompressedImage)]
    if not samples:
        return None
    try:
        return decode(samples[-1], camera.spec.height, camera.spec.width)
    except FrameError as exc:
        errors[0] += 1
        if errors[0] in (1, 100) or errors[0] % 1000 == 0:
            _log.warning("camera frame dropped", camera=camera.name, error=str(exc), dropped=errors[0])
        return None


class Ros2Cameras:
    """The cameras of a ROS 2 robot, implementing the `Cameras` protocol (see the module docstring).

    `connect` and `disconnect` are called by the owner (the edge's main process); each camera's
    reader is used only by its capture thread; `read_cameras` may be called from any thread.
    """

    def __init__(self, setup: Ros2Setup) -> None:
        self.setup = setup
        self._link: Link | None = None
        self._slots: dict[str, LatestFrame] = {}
        self._threads: list[CaptureThread] = []

    def connect(self) -> None:
        """Subscribe to every camera topic and wait for each camera's first frame. Idempotent.

        Raises:
            ConnectionError: a camera delivered no usable frame within ``connect_timeout_s``.
        """
        if self._link is not None or not self.setup.cameras:
            return
        self._link = link = open_link(self.setup)
        try:
            for camera in self.setup.cameras:
                kind = CompressedImage if camera.compressed else Image
                reader = link.reader(camera.topic, kind, reliable=False, waits=True)
                slot = LatestFrame()
                thread = CaptureThread(camera.name, functools.partial(_grab, reader, camera, [0]), slot, owner=self)
                self._slots[camera.name] = slot
                self._threads.append(thread)
                thread.start()
            for camera in self.setup.cameras:
                if self._slots[camera.name].wait(0, self.setup.connect_timeout_s) is None:
                    raise ConnectionError(
                        f"ROS 2 robot: camera {camera.name!r} got no {'jpeg ' if camera.compressed else 'rgb8/bgr8 '}"
                        f"frame of {camera.spec.width}x{camera.spec.height} on {camera.topic} "
                        f"within {self.setup.connect_timeout_s:g} s ({self.setup.transport}, domain "
                        f"{self.setup.domain_id}: is the camera publishing there, with this ROS_DOMAIN_ID?)"
                    )
        except BaseException:
            self.disconnect()
            raise
        _log.info("cameras connected", cameras=[camera.name for camera in self.setup.cameras])

    def disconnect(self) -> None:
        """Stop the capture threads, then leave the graph. Idempotent."""
        for thread in self._threads:
            thread.stop()
        self._threads.clear()
        self._slots.clear()
        if self._link is not None:
            link, self._link = self._link, None
            link.close()

    def read_cameras(self) -> dict[str, Frame]:
        """Newest frame of every camera, without waiting."""
        return newest_frames(self._slots)
