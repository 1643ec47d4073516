"""Frame encoding (JPEG, and shrinking to the policy's input size) on persistent per-camera threads.

One thread per camera lives as long as the session: the cameras of an observation encode in
parallel (libjpeg-turbo and numpy release the GIL) without a thread hand-off per camera per
request, and each thread holds one job at most, the newest: a frame whose request was abandoned
before its encode started is skipped. A frame the session's server takes smaller is shrunk there
first, with the server's own function (`servo.wire.downsize`). The session's uplink thread
(`servo.client.uplink`) hands the frames over and waits for them, so the event loop never waits
on an encode.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from servo.wire import EncodedImage, check_frame, downsize, encode_image

Frame = npt.NDArray[np.uint8]

#: What a worker reports: the camera, its encoded frame (or the error) and the encode time (ns).
Report = Callable[[str, EncodedImage | BaseException, int], None]


@dataclass(frozen=True)
class _Job:
    frame: Frame
    quality: int
    report: Report
    #: Shrink to this (height, width) first; None: as it is.
    size: tuple[int, int] | None = None


class _CameraThread:
    """One camera's encoder: its own thread, fed through a newest-wins slot by the event loop."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._wake = threading.Condition()
        self._job: _Job | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"servo-encode-{name}", daemon=True)
        self._thread.start()

    def submit(self, job: _Job) -> None:
        with self._wake:
            self._job = job  # replaces a job not started yet: its request was abandoned
            self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._job is None and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                job, self._job = self._job, None
            assert job is not None
            started = time.perf_counter_ns()
            try:
                frame = job.frame if job.size is None else downsize(job.frame, job.size)
                result: EncodedImage | BaseException = encode_image(frame, job.quality)
            except Exception as exc:  # handed to the requester, who raises it
                result = exc
            job.report(self.name, result, time.perf_counter_ns() - started)


class FrameEncoder:
    """Encodes an observation's frames on per-camera threads; used by one session's uplink thread.

    Threads start with the first frame of their camera and stop at `close`. Raw frames (quality
    0) that need no shrinking are zero-copy views and never leave the calling thread.
    ``camera_ms`` is written by the camera threads and read by anyone (a snapshot of floats).
    """

    def __init__(self) -> None:
        self._threads: dict[str, _CameraThread] = {}
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
            Exception: what encoding a frame raised.
        """
        shrink = {name: size for name, frame in frames.items() if (size := _smaller((sizes or {}).get(name), frame))}
        if (quality == 0 and not shrink) or not frames:
            return {name: encode_image(frame, 0) for name, frame in frames.items()}
        done = threading.Condition()
        results: dict[str, EncodedImage | BaseException] = {}

        def report(name: str, result: EncodedImage | BaseException, ns: int) -> None:
            self.camera_ms[(name, quality)] = ns / 1e6
            with done:
                results[name] = result
                done.notify()

        for name, frame in frames.items():
            if name not in self._threads:
                self._threads[name] = _CameraThread(name)
            self._threads[name].submit(_Job(frame, quality, report, shrink.get(name)))
        with done:
            done.wait_for(lambda: len(results) == len(frames))
        out = {}
        for name in frames:
            result = results[name]
            if isinstance(result, BaseException):
                raise result
            out[name] = result
        return out

    def close(self) -> None:
        """Stop every camera thread (each after the frame it is encoding, if any)."""
        for thread in self._threads.values():
            thread.close()
        self._threads.clear()


def _smaller(size: tuple[int, int] | None, frame: Frame) -> tuple[int, int] | None:
    """``size`` when ``frame`` is larger than it in both dimensions (then it is shrunk), else None."""
    if size is None or size == frame.shape[:2] or size[0] > frame.shape[0] or size[1] > frame.shape[1]:
        return None
    return size
