"""Latest-frame slot and capture thread shared by the simulated, OpenCV and ROS 2 cameras.

A camera runs its own capture thread that produces frames at the camera's pace and drops each
one into a `LatestFrame` (a `servo.stages.NewestSlot`); the control loop only ever takes the
newest frame, so it never waits on a camera and a slow consumer never builds a backlog.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Mapping

from servo.logs import Logger, get_logger
from servo.stages import NewestSlot, StageThread

from .protocol import Frame

_log = get_logger(__name__)

Grab = Callable[[], Frame | None]
"""Produces the next frame, or ``None`` when none could be had this time (e.g. a USB hiccup)."""

# Pause after a failed grab so a dead device does not spin a core; the loop still wakes at once
# when it is told to stop, because it waits on the stop event rather than sleeping.
_RETRY_PAUSE_S = 0.01


class LatestFrame(NewestSlot[Frame]):
    """The newest frame of one camera: a `NewestSlot` whose frames are read-only once published.

    Written by exactly one capture thread, read from any thread (normally the control loop).
    Publishing swaps one reference, so `latest` never blocks on the writer. Published frames are
    flagged read-only: the capture side renders or decodes into a fresh array every time, so a
    reader may hand a frame on without copying it.
    """

    def publish(self, frame: Frame) -> None:
        """Make ``frame`` the newest frame; it must not be written to afterwards."""
        frame.flags.writeable = False
        self.put(frame)

    def latest(self) -> Frame | None:
        """Newest frame, or ``None`` before the first one; never waits."""
        return self.peek()

    @property
    def seq(self) -> int:
        """Number of frames published so far."""
        return self.version

    def wait(self, after_seq: int = 0, timeout_s: float = 1.0) -> Frame | None:
        """Block until a frame newer than ``after_seq`` is published.

        Meant for start-up (waiting for a camera's first frame) and for tests, never for the
        control loop.

        Args:
            after_seq: Sequence number the caller has already seen (see `seq`).
            timeout_s: Longest time to wait.

        Returns:
            The newest frame, or ``None`` if none newer arrived in time.
        """
        return self.wait_newer(after_seq, timeout_s)


def newest_frames(slots: Mapping[str, LatestFrame]) -> dict[str, Frame]:
    """The newest frame of every camera that has one, by name, without waiting (any thread)."""
    frames: dict[str, Frame] = {}
    for name, slot in slots.items():
        frame = slot.latest()
        if frame is not None:
            frames[name] = frame
    return frames


class CaptureThread:
    """Runs one camera's grab loop as the one job of its stage thread and publishes into a `LatestFrame`.

    `start` and `stop` are called by the thread that owns the camera (the control-loop thread,
    during connect/disconnect); the loop runs on its own daemon thread named
    ``servo-cam-<name>`` (a `servo.stages.StageThread`). The loop stops when `stop` is called,
    when ``owner`` is garbage collected, or when the interpreter exits (stages are closed then,
    so ``on_exit`` still releases the device unless a grab outlasts the exit's grace).

    ``grab`` (and ``on_exit``) must not hold a strong reference to ``owner``: the thread keeps
    them alive, so the owner could then never be collected.
    """

    def __init__(
        self,
        name: str,
        grab: Grab,
        slot: LatestFrame,
        *,
        owner: object,
        period_s: float | None = None,
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        """Prepare the thread; nothing runs until `start`.

        Args:
            name: Camera name, used for the thread name and logs.
            grab: Produces one frame per call; may block up to about one frame period.
            slot: Where frames are published.
            owner: Object whose collection stops the loop (the camera or robot).
            period_s: Pace the loop at this period on the monotonic clock; ``None`` when ``grab``
                paces itself (a real device blocks until its next frame).
            on_exit: Called on the capture thread once the loop ends, e.g. to release the device
                from the thread that used it.
        """
        self.name = name
        self._grab = grab
        self._slot = slot
        self._period_s = period_s
        self._on_exit = on_exit
        self._owner = weakref.ref(owner)
        self._stage: StageThread | None = None
        self._finalizer: weakref.finalize[..., object] | None = None
        self._log = _log.bind(camera=name)

    def start(self) -> None:
        """Start the capture thread (once)."""
        if self._stage is not None:
            raise RuntimeError(f"capture thread for camera {self.name!r} was already started")
        owner = self._owner()
        if owner is None:
            return  # collected already: nothing would stop the loop but a close
        self._stage = stage = StageThread(f"servo-cam-{self.name}", capacity=1)
        self._finalizer = weakref.finalize(owner, stage.close)
        stage.submit(_run, self._grab, self._slot, stage.closing, self._period_s, self._on_exit, self._log)

    def stop(self, timeout_s: float = 2.0) -> bool:
        """Ask the loop to stop and join it.

        Args:
            timeout_s: Longest time to wait for the thread to finish its current grab.

        Returns:
            ``True`` if the thread has ended (or never started).
        """
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._stage is None:
            return True
        if not self._stage.close(timeout=timeout_s):
            self._log.warning("capture thread did not stop in time", timeout_s=timeout_s)
            return False
        return True

    def join(self, timeout_s: float) -> bool:
        """Wait for the loop to end on its own (e.g. after its owner was collected).

        Returns:
            ``True`` if the thread has ended (or never started).
        """
        return self._stage is None or self._stage.join(timeout_s)

    @property
    def is_alive(self) -> bool:
        """Whether the capture thread is running."""
        return self._stage is not None and self._stage.alive


def _run(
    grab: Grab,
    slot: LatestFrame,
    stop: threading.Event,
    period_s: float | None,
    on_exit: Callable[[], None] | None,
    log: Logger,
) -> None:
    # A plain function rather than a method: the thread must not keep the CaptureThread (and
    # through it the owner) alive beyond what the arguments name.
    failures = 0
    deadline = time.monotonic()
    try:
        while not stop.is_set():
            try:
                frame = grab()
            except Exception:
                frame = None
                if failures == 0:
                    log.exception("camera grab raised")
            if frame is None:
                failures += 1
                if failures in (1, 100) or failures % 1000 == 0:
                    log.warning("camera produced no frame", consecutive_failures=failures)
                if stop.wait(_RETRY_PAUSE_S):
                    break
                continue
            if failures:
                log.info("camera recovered", after_failures=failures)
                failures = 0
            slot.publish(frame)
            if period_s is not None:
                deadline += period_s
                delay = deadline - time.monotonic()
                if delay <= 0:
                    # Fell behind (slow render, suspended process): skip the missed frames
                    # instead of bursting to catch up.
                    deadline = time.monotonic()
                elif stop.wait(delay):
                    break
    finally:
        if on_exit is not None:
            try:
                on_exit()
            except Exception:
                log.exception("camera release failed")
