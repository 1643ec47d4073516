"""The fixed-rate control loop: robot in, engine, safety, robot out — on its own thread.

Per tick it reads the robot, hands the newest observation to the engine (a reference swap),
pops one action (lock-free), clamps it, sends it and queues a recording entry. It never does
network I/O, JPEG work or disk writes. Deadlines are absolute (``start + k * period``): a late
tick is counted as missed and the schedule skips ahead instead of accumulating lag.

The loop thread asks the kernel for real-time scheduling (``SCHED_FIFO``, best effort): on a
busy edge CPU (camera threads, the network worker, other processes) a normal thread wakes up
milliseconds late, a real-time one within tens of microseconds. Without the privilege
(CAP_SYS_NICE or an ``rtprio`` rlimit) the loop runs at normal priority and says so once.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from servo._core import LatencyTracker
from servo.edge.engine import InferenceEngine
from servo.edge.observation import ObservationInput
from servo.edge.recorder import Recorder, Tick
from servo.edge.safety import SafetyLimiter
from servo.logs import get_logger
from servo.robots.protocol import Robot

log = get_logger(__name__)

FloatArray = npt.NDArray[np.float32]

#: SCHED_FIFO priority of the control thread: above every normal thread, below the kernel's
#: own real-time threads (IRQ threads run at 50).
REALTIME_PRIORITY = 10
#: Ticks whose lateness the run summary's jitter percentiles cover (100 s at 100 Hz; 80 KB).
JITTER_WINDOW = 10_000
#: Ticks the live status line's jitter covers (10 s at 30 Hz).
RECENT_JITTER_WINDOW = 300


def request_realtime(priority: int = REALTIME_PRIORITY) -> bool:
    """Put the calling thread under ``SCHED_FIFO`` at ``priority``; False if not permitted.

    Linux applies the policy to the calling thread only (the pid argument 0 is the thread).
    ``SCHED_RESET_ON_FORK`` keeps threads this one starts (e.g. a local policy's OpenMP workers
    when inference runs on the loop) at normal priority instead of spinning at real-time priority.
    """
    setter = getattr(os, "sched_setscheduler", None)
    if setter is None:
        return False
    try:
        setter(0, os.SCHED_FIFO | getattr(os, "SCHED_RESET_ON_FORK", 0), os.sched_param(priority))
    except OSError:
        return False
    return True


class ControlLoop:
    """Drives one robot at ``robot.spec.fps``.

    Owns the robot between `start` and `stop` (the robot's methods are only called from the
    loop thread then). `park` may be called from any thread.

    ::

        created ──start()──► running ──park(pose)──► parking ──within tolerance──► parked (holds pose)
                                │                       │                              │
                                └──── stop(), or an exception (kept in ``error``) ─────┴──► stopped

    Tick lateness ("jitter": how late a tick started after its deadline) is kept in fixed
    windows, whatever the uptime: ``jitter`` (the last `JITTER_WINDOW` ticks, for the run
    summary), ``recent_jitter`` (the last `RECENT_JITTER_WINDOW`, for the status line), and
    the all-time ``max_jitter_ns``; ``on_tick(tick, lateness_ns)`` sees every tick
    (instrumentation: tests, benchmarks).
    """

    def __init__(
        self,
        robot: Robot,
        engine: InferenceEngine,
        limiter: SafetyLimiter,
        *,
        recorder: Recorder | None = None,
        task: str = "",
        clock: Callable[[], int] = time.monotonic_ns,
        realtime: bool = True,
        on_tick: Callable[[int, int], None] | None = None,
    ) -> None:
        self.robot = robot
        self.engine = engine
        self.limiter = limiter
        self.recorder = recorder
        self.task = task
        self._clock = clock
        self._want_realtime = realtime
        #: Whether the loop thread got real-time scheduling (set once it runs).
        self.realtime = False
        self.period_ns = round(1e9 / robot.spec.fps)
        self.ticks = 0
        self.actions_executed = 0
        self.missed_deadlines = 0
        self.jitter = LatencyTracker(JITTER_WINDOW)
        self.recent_jitter = LatencyTracker(RECENT_JITTER_WINDOW)
        self.max_jitter_ns = 0
        self.on_tick = on_tick
        self.last_state: FloatArray | None = None
        self.last_command: FloatArray | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._override: FloatArray | None = None
        self._override_tolerance = 0.0
        self._parked = threading.Event()
        self._thread = threading.Thread(target=self._run, name="servo-control", daemon=True)

    def start(self) -> None:
        """Anchor the slew limiter on the measured pose and start ticking."""
        self.limiter.start_from(self.robot.read_state())
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the current tick."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        """Whether the loop thread is alive."""
        return self._thread.is_alive()

    def park(self, pose: FloatArray, *, tolerance: float, timeout: float) -> bool:
        """Drive to ``pose`` instead of the policy, still slew-limited; False on timeout.

        Returns once the robot is within ``tolerance`` of ``pose``, or False if that took longer
        than ``timeout`` seconds.
        """
        self._override_tolerance = tolerance
        self._parked.clear()
        self._override = np.asarray(pose, dtype=np.float32)
        return self._parked.wait(timeout)

    def _run(self) -> None:
        if self._want_realtime:
            self.realtime = request_realtime()
            log.info("control thread scheduling", realtime=self.realtime, priority=REALTIME_PRIORITY)
        next_ns = self._clock()
        try:
            while not self._stop.is_set():
                now = self._clock()
                self._count_lateness(now - next_ns)
                self._tick(now)
                next_ns += self.period_ns
                after = self._clock()
                if after > next_ns:
                    late = (after - next_ns) // self.period_ns + 1
                    self.missed_deadlines += int(late)
                    next_ns += late * self.period_ns
                self._stop.wait((next_ns - self._clock()) / 1e9)
        except BaseException as exc:  # the runtime must learn that the loop died, then tear down
            self.error = exc
            log.exception("control loop failed")

    def _count_lateness(self, lateness_ns: int) -> None:
        # A wait can end a hair early: jitter is the distance from the deadline either way.
        jitter = abs(lateness_ns)
        self.jitter.add(jitter)
        self.recent_jitter.add(jitter)
        self.max_jitter_ns = max(self.max_jitter_ns, jitter)
        if self.on_tick is not None:
            self.on_tick(self.ticks, lateness_ns)

    def _tick(self, now: int) -> None:
        robot = self.robot
        state = robot.read_state()
        self.last_state = state
        images = robot.read_cameras()
        self.engine.notify_observation(ObservationInput(state, images, now, self.task))
        override = self._override
        # While parking, policy actions are not executed: popping them would count fallback
        # ticks (and starve the engine into STALLED) for a robot that is not using them.
        action = self.engine.get_action(now) if override is None else None
        command: FloatArray | None = None
        if override is not None:
            command = self.limiter.apply(override)
            if float(np.max(np.abs(state - override))) <= self._override_tolerance:
                self._parked.set()
        elif action is not None:
            command = self.limiter.apply(action.values)
            self.actions_executed += 1
        if command is not None:
            robot.send_action(command)
            self.last_command = command
        if self.recorder is not None:
            source = "park" if override is not None else ("none" if action is None else action.source)
            self.recorder.record(
                Tick(
                    tick=self.ticks,
                    mono_ns=now,
                    state=state,
                    action=command,
                    source=source,
                    provenance=None if action is None or override is not None else action.provenance,
                    images=images,
                )
            )
        self.ticks += 1
