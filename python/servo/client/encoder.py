"""Frame encoding (JPEG, and shrinking to the policy's input size) on persistent per-camera threads.

One `StageThread` per camera ("servo-encode-<camera>") lives as long as the session: the cameras
of an observation encode in parallel (libjpeg-turbo and numpy release the GIL) without a thread
start per camera per request. Each stage is newest-wins: a frame whose request was abandoned
before its encode started is skipped (its future fails with `Superseded`). A frame the session's
server takes smaller is shrunk there first, with the server's own function (`servo.wire.downsize`).
The session's uplink thread (`servo.client.uplink`) hands the frames over and waits for their
futures, so the event loop never waits on an encode, and a close settles every future (an
encode that never ran fails with `StageClosed`): the uplink thread never waits for good.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from servo.client.codec import CodecStatus, codec_name
from servo.stages import StageThread
from servo.wire import EncodedImage, check_frame, downsize, encode_image

Frame = npt.NDArray[np.uint8]


class FrameEncoder:
    """Encodes an observation's frames on per-camera stages; used by one session's uplink thread.

    A camera's stage starts with its first frame and closes at `close` (from any thread). Raw
    frames (quality 0) that need no shrinking are zero-copy views and never leave the calling
    thread. ``camera_ms`` is written by the camera threads and read by anyone (a snapshot of floats).
    """

    def __init__(self) -> None:
        self._stages: dict[str, StageThread] = {}
        self._closed = False
        #: Encode time of the latest frame of each camera (ms), by quality.
        self.camera_ms: dict[tuple[str, int], float] = {}

    @staticmethod
    def check(frames: Mapping[str, Frame]) -> None:
        """Refuse frames that are not RGB uint8 (H, W, 3) before any work starts.

        Raises:
            WireError: naming the camera.
        """
        for name, frame in frames.items():
            check_frame(frame, what=f"camera {name!r}")

    def encode(
        self, frames: Mapping[str, Frame], quality: int, sizes: Mapping[str, tuple[int, int]] | None = None
    ) -> dict[str, EncodedImage]:
        """Encode every (checked) frame at ``quality`` (0: raw), in the order given; blocks until done.

        ``sizes`` maps a camera to the (height, width) its frames are shrunk to first, when they
        are larger in both dimensions (`servo.wire.downsize`); other frames are sent as they are.

        Raises:
            NotRun: the encoder was closed before a frame's encode started.
            Exception: what encoding a frame raised.
        """
        shrink = {name: size for name, frame in frames.items() if (size := _smaller((sizes or {}).get(name), frame))}
        if (quality == 0 and not shrink) or not frames:
            return {name: encode_image(frame, 0) for name, frame in frames.items()}
        futures = {
            name: self._stage(name).submit(self._encode, name, frame, quality, shrink.get(name))
            for name, frame in frames.items()
        }
        return {name: future.result() for name, future in futures.items()}

    def close(self) -> None:
        """Close every camera stage (each after the frame it encodes); frames not started fail: `StageClosed`."""
        self._closed = True
        for stage in list(self._stages.values()):  # the uplink thread may be adding one (see `_stage`)
            stage.close()

    def with_camera_times(self, status: CodecStatus) -> CodecStatus:
        """``status`` with each camera's latest encode time per quality (``camera_encode_ms``)."""
        per_camera = {f"{camera}/{codec_name(q)}": round(ms, 3) for (camera, q), ms in self.camera_ms.items()}
        return dataclasses.replace(status, camera_encode_ms=per_camera)

    def _stage(self, name: str) -> StageThread:
        stage = self._stages.get(name)
        if stage is None:
            stage = self._stages[name] = StageThread(f"servo-encode-{name}", newest_wins=True)
            if self._closed:  # closed meanwhile by another thread: refuses at once
                stage.close()
        return stage

    def _encode(self, name: str, frame: Frame, quality: int, size: tuple[int, int] | None) -> EncodedImage:
        """A camera's thread: shrink (if ``size``), then encode one frame."""
        started = time.perf_counter_ns()
        image = encode_image(frame if size is None else downsize(frame, size), quality)
        self.camera_ms[(name, quality)] = (time.perf_counter_ns() - started) / 1e6
        return image


def _smaller(size: tuple[int, int] | None, frame: Frame) -> tuple[int, int] | None:
    """``size`` when ``frame`` is larger than it in both dimensions (then it is shrunk), else None."""
    if size is None or size == frame.shape[:2] or size[0] > frame.shape[0] or size[1] > frame.shape[1]:
        return None
    return size
