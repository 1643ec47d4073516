"""One control tick, and the fixed-rate schedule that runs it: read → pop → safety → write.

Per tick the `Ticker` reads the joints, publishes the observation (newest wins), pops one action
(staleness bound and fallback ladder included), passes it through the safety layer, sends it and
hands a recording entry over — all through shared memory (`servo.edge.channel`), so it runs the
same in the edge's control process and on the sequential engine's control thread. It never does
network I/O, JPEG work, camera work or disk writes.

Deadlines are absolute (``start + k * period``): a late tick is counted as missed and the schedule
skips ahead instead of accumulating lag; every tick's lateness goes into the channel's histogram.
The wait for a deadline sleeps to just before it and spins the rest (`DeadlineSleeper`): an idle
core wakes late, a spinning one does not.

::

    running ──non-finite target or command──► faulted: sends nothing (the robot holds its last
       │                                       safe command), keeps publishing, waits to be parked
       ├──no fresh state (RobotFault)──► faulted and blind: sends and publishes nothing; the next
       │                                 fresh state re-anchors the slew limit, then as faulted
       └──park command (any state)──► parking ──pose within tolerance──► parked (holds the pose)
    stop, or the edge gone and the arm parked (or the park timed out) ──► the schedule returns
"""

from __future__ import annotations

import time
from collections import deque
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

#: The least a tick spins before its deadline (ns): what a busy (awake) core takes to wake.
LEAD_MIN_NS = 200_000
#: The most it spins (ns), and never more than half the period.
LEAD_MAX_NS = 5_000_000
#: Added to the latest wake-ups seen when choosing the lead (ns).
LEAD_SLACK_NS = 150_000
#: Sleeps whose wake-up lateness sets the lead (the worst of them rules).
WAKE_WINDOW = 64


class DeadlineSleeper:
    """Waits for absolute deadlines: sleeps to just before one, then spins to it. Owned by the loop's thread.

    A sleeping thread is woken by a timer, and on a virtual machine whose core went idle that takes
    milliseconds (3-5 ms on the 2-vCPU VM servo is measured on, with nothing else running), while a
    core that stayed busy wakes in microseconds. So the wait sleeps until ``deadline - lead`` and
    spins the rest, the lead following how late the last `WAKE_WINDOW` sleeps woke (the worst of
    them plus `LEAD_SLACK_NS`), between `LEAD_MIN_NS` and `LEAD_MAX_NS` (at most half the period).
    On a loaded machine it spins a fraction of a millisecond per tick; on an idle one about as
    long as its wake-ups take, on a core nothing else wanted. ``spun_ns`` adds up what it spun.

    Args:
        period_ns: The schedule's period (bounds the lead).
        spin: False: a plain sleep to the deadline (no lead, no spinning).
        clock: Monotonic clock in ns.
        sleep: Sleeps for a number of seconds (injectable for tests).
    """

    def __init__(
        self,
        period_ns: int,
        *,
        spin: bool = True,
        clock: Callable[[], int] = time.monotonic_ns,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._max_lead_ns = max(LEAD_MIN_NS, min(LEAD_MAX_NS, period_ns // 2)) if spin else 0
        self._late: deque[int] = deque(maxlen=WAKE_WINDOW)
        self._min_lead_ns = min(LEAD_MIN_NS, self._max_lead_ns)
        self.lead_ns = self._min_lead_ns
        self.spun_ns = 0

    def wait(self, deadline_ns: int) -> None:
        """Return at ``deadline_ns`` (monotonic), not before."""
        wake_ns = deadline_ns - self.lead_ns
        now = self._clock()
        if wake_ns > now:
            self._sleep((wake_ns - now) / 1e9)
            self._late.append(max(0, self._clock() - wake_ns))
            self.lead_ns = min(self._max_lead_ns, max(self._min_lead_ns, max(self._late) + LEAD_SLACK_NS))
        started = now = self._clock()
        while now < deadline_ns:
            now = self._clock()
        self.spun_ns += now - started


class Ticker:
    """Drives one robot at ``robot.spec.fps``. Owned by the loop's thread (see the module docstring).

    Args:
        robot: The connected joints.
        actions: Where each tick's action comes from.
        limiter: The safety layer.
        channel: The block shared with the main process.
        bell: Wakes the main process on events.
        spin: Spin the last stretch before each deadline (`DeadlineSleeper`); False: a plain sleep.
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
        spin: bool = True,
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
        self.sleeper = DeadlineSleeper(self.period_ns, spin=spin, clock=clock)
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
            self.sleeper.wait(next_ns)

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
            # Whatever happened while nobody saw the robot, the next command is one slew step from
            # where it is: from the last command when the arm is still there, else from the arm.
            self._blind = False
            if self.limiter.resume_from(state):
                log.warning("robot state is back, the arm where it was commanded: commands go on from there")
            else:
                log.warning("robot state is back, the arm elsewhere: commands start again from the measured pose")
        channel.publish(self.ticks, now, self.actions.position(), state)
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
