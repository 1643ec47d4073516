"""Latest-frame slot and capture thread shared by the simulated and the OpenCV cameras.

A camera runs its own capture thread that produces frames at the camera's pace and drops each
one into a single-slot `LatestFrame`; the control loop only ever takes the newest frame, so it
never waits on a camera and a slow consumer never builds a backlog.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Mapping

from servo.logs import Logger, get_logger

from .protocol import Frame

_log = get_logger(__name__)

Grab = Callable[[], Frame | None]
"""Produces the next frame, or ``None`` when none could be had this time (e.g. a USB hiccup)."""

# Pause after a failed grab so a dead device does not spin a core; the loop still wakes at once
# when it is told to stop, because it waits on the stop event rather than sleeping.
_RETRY_PAUSE_S = 0.01


class LatestFrame:
    """Single-slot mailbox holding the newest frame of one camera.

    Written by exactly one capture thread, read from any thread (normally the control loop).
    Publishing swaps one reference, so `latest` never blocks on the writer. Published frames are
    flagged read-only: the capture side renders or decodes into a fresh array every time, so a
    reader may hand a frame on without copying it.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._frame: Frame | None = None
        self._seq = 0

    def publish(self, frame: Frame) -> None:
        """Make ``frame`` the newest frame; it must not be written to afterwards."""
        frame.flags.writeable = False
        with self._cond:
            self._frame = frame
            self._seq += 1
            self._cond.notify_all()

    def latest(self) -> Frame | None:
        """Newest frame, or ``None`` before the first one; never waits."""
        return self._frame

    @property
    def seq(self) -> int:
        """Number of frames published so far."""
        return self._seq

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
        with self._cond:
            if not self._cond.wait_for(lambda: self._seq > after_seq, timeout_s):
                return None
            return self._frame


def newest_frames(slots: Mapping[str, LatestFrame]) -> dict[str, Frame]:
    """The newest frame of every camera that has one, by name, without waiting (any thread)."""
    frames: dict[str, Frame] = {}
    for name, slot in slots.items():
        frame = slot.latest()
        if frame is not None:
            frames[name] = frame
    return frames


class CaptureThread:
    """Runs one camera's grab loop on a dedicated thread and publishes into a `LatestFrame`.

    `start` and `stop` are called by the thread that owns the camera (the control-loop thread,
    during connect/disconnect); the loop itself runs on its own thread named
    ``servo-cam-<name>``. The loop stops when `stop` is called, when ``owner`` is garbage
    collected, or when the interpreter begins shutting down, so a forgotten `stop` never leaves
    the process hanging on a non-daemon thread.

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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._finalizer = weakref.finalize(owner, self._stop.set)
        self._log = _log.bind(camera=name)

    def start(self) -> None:
        """Start the capture thread (once)."""
        if self._thread is not None:
            raise RuntimeError(f"capture thread for camera {self.name!r} was already started")
        _stop_at_exit(self._stop)
        self._thread = threading.Thread(
            target=_run,
            args=(self._grab, self._slot, self._stop, self._period_s, self._on_exit, self._log),
            name=f"servo-cam-{self.name}",
            daemon=_DAEMON,
        )
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> bool:
        """Ask the loop to stop and join it.

        Args:
            timeout_s: Longest time to wait for the thread to finish its current grab.

        Returns:
            ``True`` if the thread has ended (or never started).
        """
        self._stop.set()
        self._finalizer.detach()
        if self._thread is None or self._thread is threading.current_thread():
            return True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._log.warning("capture thread did not stop in time", timeout_s=timeout_s)
            return False
        return True

    def join(self, timeout_s: float) -> bool:
        """Wait for the loop to end on its own (e.g. after its owner was collected).

        Returns:
            ``True`` if the thread has ended (or never started).
        """
        if self._thread is not None:
            self._thread.join(timeout_s)
        return not self.is_alive

    @property
    def is_alive(self) -> bool:
        """Whether the capture thread is running."""
        return self._thread is not None and self._thread.is_alive()


def _run(
    grab: Grab,
    slot: LatestFrame,
    stop: threading.Event,
    period_s: float | None,
    on_exit: Callable[[], None] | None,
    log: Logger,
) -> None:
    # A plain function rather than a method: the thread must not keep the CaptureThread (and
    # through it nothing else) alive beyond what the arguments name.
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


# Non-daemon threads are joined by the interpreter before `atexit` handlers run, so a camera
# whose owner forgot `disconnect` would hang the exit. `threading._register_atexit` (what
# concurrent.futures uses for its workers) runs before that join; where it is missing we fall back
# to daemon threads, which the interpreter abandons instead of joining.
_register_atexit: Callable[[Callable[[], None]], None] | None = getattr(threading, "_register_atexit", None)
_DAEMON = _register_atexit is None
_live_stops: weakref.WeakSet[threading.Event] = weakref.WeakSet()
_hook_lock = threading.Lock()
_hook_installed = False


def _stop_all() -> None:
    for event in list(_live_stops):
        event.set()


def _stop_at_exit(stop: threading.Event) -> None:
    global _hook_installed
    with _hook_lock:
        _live_stops.add(stop)
        if not _hook_installed and _register_atexit is not None:
            _register_atexit(_stop_all)
            _hook_installed = True
