"""The control loop in a process of its own: the parent's handle, and the child's ``main``.

The edge spawns ``python -m servo.edge.control_process`` (fork + exec: the child inherits none
of the parent's threads) and hands it, by file descriptor, the pipeline block (the action queue
and its counters), the `ControlChannel` block and the bell's write end; then one JSON line on
stdin: a `ControlSpec` (the robot's description, the feed's rules, the safety settings). The
child builds the robot's joints itself (drivers never cross processes), connects them, asks for
``SCHED_FIFO`` for the tick and puts every other thread of the process (the driver's, the
watchdog) just below it (`servo.edge.realtime`), and ticks. Nothing else runs there: no network,
no cameras, no renderer, no JPEG, no disk.

Lifetimes are tied both ways. The child's stdin stays open as long as the parent lives: a
watchdog thread in the child reads it, and on EOF (the edge died, even by SIGKILL) the child
parks the arm at its rest pose (bounded by a timeout), disconnects and exits. When the child
ends for any reason the kernel closes its end of the bell pipe: the parent notices at once, not
on a timeout. The child runs in a session of its own, so a Ctrl-C at the terminal reaches only
the edge, which parks the arm through it. Its log records come out on stderr as JSON lines that
the parent logs again (``process="control"``).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from typing import Annotated

import anyio
import msgspec
from anyio.abc import ByteReceiveStream, Process, TaskGroup

from servo._core import SharedMemory
from servo.config import NonNegativeInt, NonNegativeSeconds, PositiveFloat, PositiveInt, doc
from servo.edge.actions import ActionFeed, ControlConfig, Source
from servo.edge.channel import Bell, ControlChannel, LoopState
from servo.edge.control_loop import ControlLoop
from servo.edge.realtime import REALTIME_PRIORITY, name_thread, rank_helpers, request_realtime, thread_table
from servo.edge.safety import SafetyLimiter
from servo.edge.ticker import Ticker
from servo.logs import configure_logging, get_logger
from servo.robots.protocol import Cameras
from servo.robots.registry import RobotDescription

log = get_logger(__name__)


class ControlSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Everything the control process needs (one JSON line on its stdin)."""

    robot: Annotated[RobotDescription, doc("The robot to build and drive.")]
    control: Annotated[ControlConfig, doc("Staleness bound, fallback and speed (the edge's [control]).")]
    source: Annotated[Source, doc("How queued actions are labelled.")]
    action_dim: Annotated[PositiveInt, doc("Joints of the robot (checked against the built driver).")]
    pipeline_fd: Annotated[NonNegativeInt, doc("Descriptor of the pipeline block (queue and its counters).")]
    channel_fd: Annotated[NonNegativeInt, doc("Descriptor of the ControlChannel block.")]
    bell_fd: Annotated[NonNegativeInt, doc("Write end of the bell pipe.")]
    realtime: Annotated[bool, doc("Ask for SCHED_FIFO.")]
    spin: Annotated[bool, doc("Spin the last stretch before each tick's deadline (else a plain sleep).")]
    log_level: Annotated[str, doc("Level of the records sent to the parent.")]
    rest_tolerance: Annotated[PositiveFloat, doc("How close to the rest pose counts as parked.")]
    orphan_park_timeout_s: Annotated[NonNegativeSeconds, doc("How long to park when the edge is gone (s).")]


#: Child stderr lines kept for the error message when it fails to start.
_TAIL = 20


class ProcessControlLoop(ControlLoop):
    """The tick in the control process: spawns, watches and (if need be) kills it. Owned by the event loop.

    Args:
        channel: A channel in shared memory.
        cameras: The robot's cameras (connected by the caller).
        robot: The robot to build in the control process.
        action_dim: Its number of joints.
        pipeline: The engine pipeline's block (`servo.edge.actions.pipeline_layout`).
        control: What the control process does with queued actions (staleness, fallback, speed).
        source: How queued actions are labelled.
        realtime: Ask for ``SCHED_FIFO``.
        spin: Sleep to just before each deadline and spin the rest (`servo.edge.ticker.DeadlineSleeper`).
        rest_tolerance: How close to the rest pose counts as parked when the edge is gone.
        orphan_park_timeout_s: How long the control process parks when the edge is gone.
        task: Task instruction attached to every observation.
    """

    def __init__(
        self,
        channel: ControlChannel,
        cameras: Cameras,
        robot: RobotDescription,
        *,
        action_dim: int,
        pipeline: SharedMemory,
        control: ControlConfig,
        source: Source = "policy",
        realtime: bool = True,
        spin: bool = True,
        rest_tolerance: float = 2.0,
        orphan_park_timeout_s: float = 5.0,
        task: str = "",
    ) -> None:
        super().__init__(channel, cameras, task=task)
        self._pipeline = pipeline
        self.spec = ControlSpec(
            robot=robot,
            control=control,
            source=source,
            action_dim=action_dim,
            pipeline_fd=pipeline.fileno(),
            channel_fd=channel.memory.fileno(),
            bell_fd=0,
            realtime=realtime,
            spin=spin,
            log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower(),
            rest_tolerance=rest_tolerance,
            orphan_park_timeout_s=orphan_park_timeout_s,
        )
        self._process: Process | None = None
        self._tail: deque[str] = deque(maxlen=_TAIL)

    @property
    def pid(self) -> int | None:
        """The control process's id, once spawned."""
        return None if self._process is None else self._process.pid

    async def _start(self, tg: TaskGroup, bell_fd: int) -> None:
        spec = msgspec.structs.replace(self.spec, bell_fd=bell_fd)
        try:
            self._process = await anyio.open_process(
                [sys.executable, "-m", "servo.edge.control_process"],
                # No linear-algebra worker threads: the tick's arithmetic is a few joints wide.
                env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(spec.pipeline_fd, spec.channel_fd, spec.bell_fd),
                start_new_session=True,
            )
        finally:
            os.close(bell_fd)  # the child holds the write end now: its exit closes the pipe
        assert self._process.stdin is not None
        assert self._process.stderr is not None
        # The pipe stays open (and unwritten) for the child's lifetime: its EOF means we died.
        await self._process.stdin.send(msgspec.json.encode(spec) + b"\n")
        tg.start_soon(self._relay_logs, self._process.stderr)

    async def _relay_logs(self, stderr: ByteReceiveStream) -> None:
        buffered = b""
        async for data in stderr:
            buffered += data
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                self._relay(line.decode("utf-8", "replace"))
        await stderr.aclose()  # the child is gone

    def _relay(self, line: str) -> None:
        try:
            record = json.loads(line)
            event = str(record.pop("event"))
        except (ValueError, KeyError, TypeError, AttributeError):
            # Not a log record: the interpreter's own output (a traceback, a fatal error).
            if line.strip():
                self._tail.append(line)
                log.warning("control process output", process="control", line=line)
            return
        level = logging.getLevelNamesMapping().get(str(record.pop("level", "info")).upper(), logging.INFO)
        record.pop("timestamp", None)
        log.log(level, event, process="control", **record)

    async def _reap(self) -> str:
        assert self._process is not None
        code = await self._process.wait()  # it closed the bell: it is exiting
        if self._process.stdin is not None:
            await self._process.stdin.aclose()
        if code == 0:
            return ""
        fault = self.channel.fault()
        if fault:
            return fault
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        last = next((line for line in reversed(self._tail) if line.strip()), "")
        return f"control process ended ({how}){': ' + last if last else ''}"

    def _kill(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.kill()


# ---------------------------------------------------------------------- the child


def _watch_parent(ticker: Ticker, tolerance: float, timeout_s: float) -> None:
    """Watchdog thread: stdin EOF means the edge is gone."""
    name_thread("servo-watchdog")
    # os.read, not sys.stdin: a daemon thread blocked inside a buffered reader's lock would
    # abort the interpreter's shutdown.
    while os.read(0, 4096):
        pass
    ticker.orphan(tolerance, timeout_s)


def _read_line(fd: int) -> bytes:
    """One line from ``fd``, read unbuffered (nothing after it is consumed)."""
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
    return line


def main() -> int:
    """Entry point of the control process (``python -m servo.edge.control_process``)."""
    # Ctrl-C and SIGTERM go to the edge, which parks the arm through this process; a SIGTERM
    # sent here directly stops the loop after the current tick.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    terminated = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: terminated.set())
    try:
        spec = msgspec.json.decode(_read_line(0), type=ControlSpec)
    except msgspec.DecodeError as exc:
        print(f"control process: bad spec on stdin: {exc}", file=sys.stderr)
        return 2
    configure_logging(spec.log_level, json=True)
    bell = Bell(spec.bell_fd)
    channel = ControlChannel.attach(spec.channel_fd, spec.action_dim)
    try:
        robot = spec.robot.build()
        if robot.spec.action_dim != spec.action_dim:
            raise ValueError(f"the robot has {robot.spec.action_dim} joints, the edge expects {spec.action_dim}")
        robot.connect()
    except Exception as exc:
        channel.raise_fault(f"robot: {exc}")
        log.error("robot could not start", error=str(exc))
        bell.close()
        return 1
    try:
        feed = ActionFeed.attach(SharedMemory.attach(spec.pipeline_fd), spec.control, spec.source)
        limiter = SafetyLimiter(robot.spec, velocity_scale=spec.control.velocity_scale)
        ticker = Ticker(robot, feed, limiter, channel, bell, spin=spec.spin)
        ticker.start()
        args = (ticker, spec.rest_tolerance, spec.orphan_park_timeout_s)
        threading.Thread(target=_watch_parent, args=args, name="servo-watchdog", daemon=True).start()
        name_thread("servo-tick")
        realtime = spec.realtime and request_realtime()
        if spec.realtime and not realtime:
            log.warning("no real-time scheduling (needs CAP_SYS_NICE or an rtprio limit): ticking at normal priority")
        threads = rank_helpers(threading.get_native_id()) if realtime else thread_table()
        log.info(
            "control process running",
            realtime=realtime,
            priority=REALTIME_PRIORITY,
            fps=robot.spec.fps,
            threads=[str(thread) for thread in threads],
        )
        # What exists now lives until exit: keep the collector from ever walking it mid-tick.
        gc.freeze()
        channel.set_state(LoopState.RUNNING, realtime=realtime)
        bell.ring(Bell.RUNNING)
        ticker.run(lambda: terminated.is_set() or channel.stop_requested())
        return 0
    except Exception as exc:
        channel.raise_fault(f"control loop failed: {exc!r}")
        log.exception("control loop failed")
        return 1
    finally:
        try:
            robot.disconnect()
        finally:
            channel.set_state(LoopState.STOPPED)
            bell.close()


if __name__ == "__main__":
    sys.exit(main())
