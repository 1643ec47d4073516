"""One control tick, and the fixed-rate schedule that runs it: read → pop → safety → write.

Per tick the `Ticker` reads the joints, publishes the observation (newest wins), pops one action
(staleness bound and fallback ladder included), passes it through the safety layer, sends it and
hands a recording entry over — all through shared memory (`servo.edge.channel`), so it runs the
same in the edge's control process and on the sequential engine's control thread. It never does
network I/O, JPEG work, camera work or disk writes.

Deadlines are absolute (``start + k * period``): a late tick is counted as missed and the schedule
skips ahead instead of accumulating lag; every tick's lateness goes into the channel's histogram.

::

    running ──non-finite target or command──► faulted: sends nothing (the robot holds its last
       │                                       safe command), keeps publishing, waits to be parked
       ├──no fresh state (RobotFault)──► faulted and blind: sends and publishes nothing; the next
       │                                 fresh state re-anchors the slew limit, then as faulted
       └──park command (any state)──► parking ──pose within tolerance──► parked (holds the pose)
    stop, or the edge gone and the arm parked (or the park timed out) ──► the schedule returns
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from servo.edge.actions import ActionSource
from servo.edge.channel import Bell, ControlChannel, Slot
from servo.edge.safety import SafetyLimiter, UnsafeTarget
from servo.logs import get_logger
from servo.recording import Source
from servo.robots.protocol import Robot, RobotFault

log = get_logger(__name__)

FloatArray = npt.NDArray[np.float32]

#: SCHED_FIFO priority of the control loop: above every normal thread, below the kernel's own
#: real-time threads (IRQ threads run at 50).
REALTIME_PRIORITY = 10


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


class Ticker:
    """Drives one robot at ``robot.spec.fps``. Owned by the loop's thread (see the module docstring).

    Args:
        robot: The connected joints.
        actions: Where each tick's action comes from.
        limiter: The safety layer.
        channel: The block shared with the main process.
        bell: Wakes the main process on events.
        clock: Monotonic clock in ns (injectable for tests).
    """

    def __init__(
        self,
        robot: Robot,
        actions: ActionSource,
        limiter: SafetyLimiter,
        channel: ControlChannel,
        bell: Bell,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.robot = robot
        self.actions = actions
        self.limiter = limiter
        self.channel = channel
        self.bell = bell
        self.period_ns = round(1e9 / robot.spec.fps)
        self.ticks = 0
        self.faulted = False
        self._clock = clock
        self._park: tuple[int, float, FloatArray] | None = None
        self._park_reached = 0
        self._orphan_deadline: int | None = None
        self._blind = False

    def start(self) -> None:
        """Anchor the slew limiter on the measured pose (the robot is connected)."""
        self.limiter.start_from(self.robot.read_state())

    def orphan(self, tolerance: float, timeout_s: float) -> None:
        """The edge is gone (any thread may call this): park at the rest pose, then end the schedule."""
        rest = np.asarray(self.robot.spec.rest_pose, dtype=np.float32)
        self._orphan_deadline = self._clock() + round(timeout_s * 1e9)
        self._park = (0, tolerance, rest)
        log.warning("the edge is gone: parking the arm, then stopping", timeout_s=timeout_s)

    def _orphan_done(self) -> bool:
        deadline = self._orphan_deadline
        return deadline is not None and (self._park_reached == -1 or self._clock() >= deadline)

    def run(self, should_stop: Callable[[], bool]) -> None:
        """Tick at the robot's rate until ``should_stop()`` (checked once per tick) or orphaned and parked."""
        period = self.period_ns
        channel = self.channel
        next_ns = self._clock()
        while not should_stop() and not self._orphan_done():
            now = self._clock()
            channel.note_lateness(now - next_ns)
            self.tick(now)
            next_ns += period
            after = self._clock()
            if after > next_ns:
                late = (after - next_ns) // period + 1
                channel.count(Slot.MISSED, late)
                next_ns += late * period
            delay = next_ns - self._clock()
            if delay > 0:
                time.sleep(delay / 1e9)

    def tick(self, now: int) -> None:
        """One tick at ``now`` (monotonic ns)."""
        robot, channel = self.robot, self.channel
        command_message = channel.park_command()
        if command_message is not None:
            self._park = command_message
        try:
            state = robot.read_state()
        except RobotFault as exc:
            self._lost_state(str(exc))
            return
        if self._blind:
            # Whatever happened while nobody saw the robot, the next command starts where it is.
            self._blind = False
            self.limiter.start_from(state)
            log.warning("robot state is back: commands start again from the measured pose")
        channel.publish(self.ticks, now, state)
        target: FloatArray | None = None
        source: Source = "none"
        provenance = None
        if self._park is not None:
            target, source = self._park[2], "park"
        elif not self.faulted:
            # While parking, policy actions are not popped: popping them would count fallback
            # ticks (and starve the engine into STALLED) for a robot that is not using them.
            action = self.actions.get_action(now)
            if action is not None:
                target, source, provenance = action.values, action.source, action.provenance
        command = None
        if target is not None:
            try:
                command = self.limiter.apply(target)
            except UnsafeTarget as exc:
                self._fault(f"{source} action refused: {exc}", provenance)
                source, provenance = "none", None
        if command is not None:
            robot.send_action(command)
            channel.count(Slot.COMMANDS)
            if source != "park":
                channel.count(Slot.ACTIONS)
        self._check_parked(state)
        channel.record(self.ticks, now, state, command, source, provenance)
        below = channel.wake_below()
        if below and self.actions.queued() < below and channel.take_wake():
            self.bell.ring(Bell.QUEUE_LOW)
        self.ticks += 1
        channel.count(Slot.TICKS)

    def _check_parked(self, state: FloatArray) -> None:
        park = self._park
        if park is None or self._park_reached in (park[0], -1):
            return
        generation, tolerance, pose = park
        if float(np.max(np.abs(state - pose))) <= tolerance:
            # The orphan's own park has generation 0: remembered as -1, reported to nobody.
            self._park_reached = generation if generation else -1
            if generation:
                self.channel.acknowledge_park(generation)
                self.bell.ring(Bell.PARKED)

    def _lost_state(self, message: str) -> None:
        """No fresh state this tick: command nothing (never from an old state), fault once."""
        if not self._blind:
            self._blind = True
            self._fault(f"robot: {message}", None)
        self.ticks += 1
        self.channel.count(Slot.TICKS)

    def _fault(self, message: str, provenance: object) -> None:
        """Latch a fault: hold the last safe command; the main process parks the arm."""
        self.faulted = True
        if self.channel.raise_fault(message):
            log.error("control fault: holding the last safe command", fault=message, provenance=str(provenance))
            self.bell.ring(Bell.FAULT)
