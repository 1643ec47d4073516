"""The edge's handle on its control loop: one interface, two places for the tick to run.

::

    main process (event loop, network, cameras, sim renderer, JPEG, recorder disk writes)
    ┌───────────────────────────────────────────────┐
    │ engine ── merge ──► ActionQueue ◄─────────────┼──── pop (ActionFeed) ─┐
    │   ▲                (pipeline block, memfd)    │                       │  control process
    │   │ latest()                                  │                       │  (SCHED_FIFO)
    │ ControlLoop ◄── observation, counters, ───────┼── ControlChannel ◄────┤  Ticker:
    │   │ park/stop    lateness, fault, records     │  (memfd)              │  read → pop →
    │   ▼                                           │                       │  safety → write
    │ cameras (render the published pose)  ◄── bell (pipe: queue low,       │  robot joints
    │ recorder (drains the records)            parked, fault; EOF = gone) ──┘
    └───────────────────────────────────────────────┘

* `ProcessControlLoop` (`servo.edge.control_process`): the tick runs in a process of its own,
  spawned (fork + exec: nothing of this process, which runs Zenoh and camera threads, is inherited),
  under ``SCHED_FIFO`` when permitted. No Python thread of the network side can hold its GIL.
* `ThreadControlLoop`: the tick runs on a thread of this process. Only the sequential engine
  uses it: its inference *is* part of the tick by definition (docs/design/control-loop.md §3, sequential mode: the
  robot stands still while the policy runs), so it cannot be real-time anyway, and running it in
  the control process would load torch and the policy into the process that must do nothing but
  tick.

Both share everything else: the same `servo.edge.ticker.Ticker`, the same `ControlChannel` (private
memory for a thread), the same bell. This class is the main-process side: it starts the loop,
listens to the bell, parks and stops it, and is the engine's `ObservationFeed` (the published
state plus the cameras' newest frames). Owned by the event loop.

::

    created ──run()──► starting ──robot connected, first tick──► running ──stop(), or the loop
                          │                                                   ended (it failed, or
                          │                                                   its process died)──► stopped
                          └──the loop ended before its first tick: EdgeStartError (nothing moved)
"""

from __future__ import annotations

import os
import threading

import anyio
import numpy as np
import numpy.typing as npt
from anyio.abc import TaskGroup, TaskStatus

from servo.edge.actions import ActionSource
from servo.edge.channel import Bell, ControlChannel, LoopState, LoopStats, Tick
from servo.edge.errors import EdgeStartError
from servo.edge.observation import ObservationInput
from servo.edge.realtime import REALTIME_PRIORITY, request_realtime
from servo.edge.safety import SafetyLimiter
from servo.edge.ticker import Ticker
from servo.logs import get_logger
from servo.robots.protocol import Cameras, Robot

log = get_logger(__name__)

FloatArray = npt.NDArray[np.float32]

#: How long the loop may take to connect the robot and tick once.
START_TIMEOUT_S = 30.0
#: How long a loop asked to stop may take before it is ended by force.
STOP_TIMEOUT_S = 5.0


class ControlLoop:
    """The main process's side of a control loop (see the module docstring). Owned by the event loop.

    Args:
        channel: The block shared with the loop.
        cameras: The robot's cameras (connected by the caller), for observations.
        task: Task instruction attached to every observation.
    """

    def __init__(self, channel: ControlChannel, cameras: Cameras, *, task: str = "") -> None:
        self.channel = channel
        self.cameras = cameras
        self.task = task
        #: Why the loop ended, if it did on its own ("" while running or after a requested stop).
        self.error = ""
        self._running = False
        self._stopped = anyio.Event()
        self._queue_low = anyio.Event()
        self._parked = anyio.Event()

    # ------------------------------------------------------------------ lifecycle
    async def _start(self, tg: TaskGroup, bell_fd: int) -> None:
        """Start the loop, which owns ``bell_fd`` (the write end) from now on."""
        raise NotImplementedError

    async def _reap(self) -> str:
        """After the bell closed: wait for the loop's end; why it ended unasked ("" if asked)."""
        raise NotImplementedError

    def _kill(self) -> None:
        """The loop did not stop when asked: end it by force."""
        raise NotImplementedError

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start the loop; ``started`` once it ticks; return when it has ended.

        Cancelled, it still stops the loop (after the current tick; the loop disconnects the
        robot) before returning; it does not park the arm (`park` first for that).

        Raises:
            EdgeStartError: the loop ended (or hung) before its first tick; nothing moved.
        """
        read_fd, write_fd = os.pipe()
        ticking = timed_out = ended = False
        try:
            async with anyio.create_task_group() as tg:
                await self._start(tg, write_fd)
                with anyio.move_on_after(START_TIMEOUT_S) as scope:
                    ticking = await self._listen(read_fd, until_running=True)
                timed_out = scope.cancelled_caught
                if ticking:
                    self._running = True
                    task_status.started()
                    await self._listen(read_fd, until_running=False)
                elif timed_out:
                    self._kill()
                    with anyio.move_on_after(STOP_TIMEOUT_S):
                        await self._listen(read_fd, until_running=False)
                ended = True
                self.error = await self._reap()
                tg.cancel_scope.cancel()
        finally:
            self._running = False
            if not ended:
                with anyio.CancelScope(shield=True):
                    await self._end(read_fd)
            os.close(read_fd)
            self._stopped.set()
            # Wake whoever waits on the loop: it will not ring again.
            self._queue_low.set()
            self._parked.set()
        if not ticking:
            late = f"no first tick within {START_TIMEOUT_S:g} s" if timed_out else "it ended"
            reason = self.error or self.channel.fault() or late
            raise EdgeStartError(f"the control loop did not start: {reason}", refused=False)

    async def _end(self, read_fd: int) -> None:
        """Stop a loop whose `run` was cancelled: ask, wait for the bell to close, force it if need be."""
        self.channel.request_stop()
        with anyio.move_on_after(STOP_TIMEOUT_S) as scope:
            await self._listen(read_fd, until_running=False)
        if scope.cancelled_caught:
            self._kill()
        with anyio.move_on_after(STOP_TIMEOUT_S):
            self.error = await self._reap()

    async def _listen(self, read_fd: int, *, until_running: bool) -> bool:
        """Dispatch the bell's events until EOF (False) or, with ``until_running``, RUNNING (True)."""
        while True:
            await anyio.wait_readable(read_fd)
            events = os.read(read_fd, 256)
            if not events:
                return False
            if Bell.QUEUE_LOW in events:
                self._queue_low.set()
            if Bell.PARKED in events:
                self._parked.set()
            if until_running and Bell.RUNNING in events:
                return True

    @property
    def running(self) -> bool:
        """Whether the loop ticks."""
        return self._running

    async def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop after the current tick (the loop disconnects the robot); force it after ``timeout``."""
        self.channel.request_stop()
        with anyio.move_on_after(timeout):
            await self._stopped.wait()
            return
        log.error("control loop did not stop in time: ending it", timeout_s=timeout)
        self._kill()
        with anyio.move_on_after(timeout):
            await self._stopped.wait()

    async def park(self, pose: FloatArray, *, tolerance: float, timeout: float) -> bool:
        """Drive to ``pose`` instead of the policy, still slew-limited; False on timeout or if not running."""
        generation = self.channel.request_park(pose, tolerance)
        with anyio.move_on_after(timeout):
            while self._running and not self.channel.parked(generation):
                self._parked = anyio.Event()
                if self.channel.parked(generation):
                    break
                await self._parked.wait()
        return self.channel.parked(generation)

    # ------------------------------------------------------------------ ObservationFeed
    def latest(self) -> ObservationInput | None:
        """The newest published state with the cameras' newest frames."""
        latest = self.channel.latest()
        if latest is None:
            return None
        tick, mono_ns, position, state = latest
        return ObservationInput(state.copy(), self.cameras.read_cameras(), mono_ns, tick, position, self.task)

    async def wait(self, queue_below: int, timeout: float) -> None:
        """Return once the loop saw fewer than ``queue_below`` queued actions, or after ``timeout``."""
        self._queue_low = anyio.Event()
        if self._running:
            self.channel.arm_wake(queue_below)
        with anyio.move_on_after(timeout):
            await self._queue_low.wait()

    # ------------------------------------------------------------------ what happened
    def statistics(self) -> LoopStats:
        """Counters, lateness percentiles and the fault."""
        return self.channel.statistics()

    @property
    def fault(self) -> str:
        """The latched fault ("" if none)."""
        return self.channel.fault()

    def drain(self) -> list[Tick]:
        """Recorder entries waiting in the channel."""
        return self.channel.drain()


class ThreadControlLoop(ControlLoop):
    """The tick on a thread of this process (the sequential engine). Owned by the event loop.

    The robot and its action source are used by the loop thread only, between start and stop.

    Args:
        channel: A channel in private memory.
        cameras: The robot's cameras (connected by the caller).
        robot: The robot's joints (not connected: the loop thread connects them).
        actions: Each tick's action (the sequential engine runs its policy in there).
        limiter: The safety layer.
        task: Task instruction attached to every observation.
        realtime: Ask for ``SCHED_FIFO`` for the loop thread (best effort).
    """

    def __init__(
        self,
        channel: ControlChannel,
        cameras: Cameras,
        robot: Robot,
        actions: ActionSource,
        limiter: SafetyLimiter,
        *,
        task: str = "",
        realtime: bool = True,
    ) -> None:
        super().__init__(channel, cameras, task=task)
        self.robot = robot
        self._actions = actions
        self._limiter = limiter
        self._realtime = realtime
        self._thread: threading.Thread | None = None
        self._failure = ""

    async def _start(self, tg: TaskGroup, bell_fd: int) -> None:
        self._thread = threading.Thread(target=self._loop, args=(Bell(bell_fd),), name="servo-control", daemon=True)
        self._thread.start()

    def _loop(self, bell: Bell) -> None:
        channel = self.channel
        connected = False
        try:
            self.robot.connect()
            connected = True
            # No spinning on a thread: it would hold the GIL the network side needs meanwhile.
            ticker = Ticker(self.robot, self._actions, self._limiter, channel, bell, spin=False)
            ticker.start()
            realtime = self._realtime and request_realtime()
            log.info("control thread scheduling", realtime=realtime, priority=REALTIME_PRIORITY)
            channel.set_state(LoopState.RUNNING, realtime=realtime)
            bell.ring(Bell.RUNNING)
            ticker.run(channel.stop_requested)
        except Exception as exc:  # the runtime learns it from the bell closing, then parks nothing
            self._failure = f"control loop failed: {exc!r}"
            channel.raise_fault(self._failure)
            log.exception("control loop failed")
        finally:
            if connected:
                self.robot.disconnect()
            channel.set_state(LoopState.STOPPED)
            bell.close()

    async def _reap(self) -> str:
        if self._thread is not None:
            await anyio.to_thread.run_sync(self._thread.join, STOP_TIMEOUT_S)
        return self._failure

    def _kill(self) -> None:
        # A thread cannot be ended by force; the stop flag stays set for when it comes back.
        log.error("control thread is stuck in a tick")
