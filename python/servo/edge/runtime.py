"""The edge runtime: robot, cameras, engine and control loop, supervised until a stop condition.

Then a safe teardown (rest pose, disconnect) and a run summary. The control loop runs in a
process of its own (`servo.edge.control_process`; a thread for the sequential engine): this
process keeps the network, the cameras (the simulator renders the pose the loop publishes), the
recorder's disk writes and the supervision. Whatever ends the run (duration, signal, DEAD, a
control fault such as a non-finite action, the control loop dying), the arm is parked if the
loop still ticks, and the summary's ``final_state``, ``stop_reason`` and ``fault`` say why.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import numpy as np
from anyio.abc import TaskStatus

from servo._core import LatencyTracker
from servo.config import ConfigError
from servo.edge.channel import ControlChannel
from servo.edge.config import EdgeConfig
from servo.edge.control_loop import ControlLoop, ThreadControlLoop
from servo.edge.control_process import ProcessControlLoop
from servo.edge.display import Display
from servo.edge.engine import EngineBase
from servo.edge.recorder import Recorder
from servo.edge.safety import SafetyLimiter
from servo.edge.status import show_status
from servo.edge.telemetry import TelemetryPublisher
from servo.logs import get_logger
from servo.private_files import private_opener
from servo.robots.protocol import Cameras
from servo.robots.registry import RobotDescription

log = get_logger(__name__)

#: Supervision period: how quickly a stop condition is noticed.
_SUPERVISE_S = 0.05
#: How often the recorder drains the control loop's entries.
_DRAIN_S = 0.05


@dataclass
class RunOptions:
    """How long to run and what to write."""

    duration_s: float | None = None
    summary_path: str | None = None
    record_path: str | None = None
    record_images_every: int = 0
    #: Let ``record_path`` replace an existing file (refused otherwise: recordings are data).
    record_overwrite: bool = False
    #: Where the live status line goes (a terminal's `servo.cli.console.Console.status`); None: no line.
    status: Callable[[str], None] | None = None
    #: A live view of the run (``--display``), started once the cameras are and closed at the end.
    display: Display | None = None
    #: Signed status records for monitors (remote engines: on the engine's Zenoh session).
    telemetry: TelemetryPublisher | None = None
    rest_tolerance: float = 2.0
    park_timeout_s: float = 5.0
    #: SCHED_FIFO for the control loop (best effort); ``spin``: see `ProcessControlLoop` (False: plain sleeps).
    realtime: bool = True
    spin: bool = True
    #: Python's GIL switch interval while running (None keeps the default 5 ms): a control
    #: *thread* that wakes while a camera or network thread holds the GIL waits up to this long.
    switch_interval_s: float | None = 0.001
    #: Where the tick runs: "auto" (a process of its own; a thread for the sequential engine,
    #: whose policy runs inside the tick), or "thread" to force the in-process loop (baselines).
    control_loop: Literal["auto", "thread"] = "auto"


@dataclass
class RunSummary:
    """What happened during a run (written as JSON with ``--summary``).

    ``rtt_ms`` covers the last `EngineBase.rtt` window. ``tick_jitter_ms`` (how late ticks started)
    covers the whole run from a fixed histogram (p50/p99 are upper bounds within 10 µs below
    10 ms), ``max`` is exact. ``fault`` is the control fault that ended the run, if one did.
    ``chunks_rejected`` counts the server messages that never reached the queue, by reason
    (forged, replayed, malformed, non-finite…); ``rogue_servers`` the replicas skipped as
    untrusted or forged. ``codec`` (remote engines) is the last session's codec choice: the option
    in use, each option's measured cost (ms, median), frame bytes and requests, the effective
    link throughput (Mbit/s), switches and probes (`servo.client.codec.CodecStatus`). ``stalls``
    says why the control loop ran out of fresh actions: each cause the engine diagnosed when it
    went STALLED (chunks too short for the round trip, a late chunk, a request sent too late, none
    in flight), with how many times, most frequent first.
    """

    ticks: int
    actions_executed: int
    fallback_ticks: int
    chunks_received: int
    chunks_dropped: int
    reconnects: int
    rtt_ms: dict[str, float | None]
    tick_jitter_ms: dict[str, float | None]
    final_state: str
    missed_deadlines: int = 0
    requests: int = 0
    timeouts: int = 0
    resent: int = 0
    errors: int = 0
    stale_refusals: int = 0
    network_requests: int = 0
    duration_s: float = 0.0
    stop_reason: str = ""
    parked: bool = False
    fault: str = ""
    control_loop: str = ""
    realtime: bool = False
    records_dropped: int = 0
    transitions: list[list[str]] = field(default_factory=list)
    chunks_rejected: dict[str, int] = field(default_factory=dict)
    rogue_servers: int = 0
    codec: dict[str, Any] = field(default_factory=dict)
    stalls: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        """Pretty JSON."""
        return json.dumps(self.__dict__, indent=2)


class EdgeRuntime:
    """Supervises one robot run. Owned by the event loop.

    Args:
        robot: Which robot to drive (its joints are built where the control loop runs).
        engine: The inference engine (remote or local).
        config: Edge options.
        options: Run options.
    """

    def __init__(self, robot: RobotDescription, engine: EngineBase, config: EdgeConfig, options: RunOptions) -> None:
        self.robot = robot
        self.engine = engine
        self.config = config
        self.options = options
        self.loop: ControlLoop | None = None
        self._loop_started = False
        self._stop = anyio.Event()
        self.stop_reason = ""

    def hurry(self) -> None:
        """Second interrupt: keep parking the arm, skip every wait that is not about safety."""
        self.engine.hurry()

    def request_stop(self, reason: str = "requested") -> None:
        """Begin the safe teardown (event loop thread)."""
        if not self._stop.is_set():
            self.stop_reason = reason
            self._stop.set()

    async def run(self) -> RunSummary:
        """Run until duration, signal, DEAD, a control fault or the loop's end; always tears down safely.

        Raises:
            EdgeStartError: the engine or the control loop could not start (nothing has moved).
            ConfigError: the recording would replace an existing file, or the display cannot open
                its destination (nothing has moved).
        """
        opts = self.options
        if opts.record_path and not opts.record_overwrite and await anyio.Path(opts.record_path).exists():
            raise ConfigError(f"--record: {opts.record_path} exists; pass --overwrite to replace it")
        in_thread = opts.control_loop == "thread" or self.engine.runs_on_control_loop
        # The display reads the same tick records as the recorder.
        channel = ControlChannel.create(
            self.engine.spec.action_dim,
            shared=not in_thread,
            recording=bool(opts.record_path) or opts.display is not None,
        )
        cameras = self.robot.build_cameras(channel)
        self.loop = loop = self._make_loop(channel, cameras, in_thread)
        self.engine.bind(loop)
        started = time.monotonic()
        recorder = None
        parked = False
        switch_interval = sys.getswitchinterval()
        if opts.switch_interval_s is not None:
            sys.setswitchinterval(opts.switch_interval_s)
        # Cameras first, as LeRobot does: a camera that fails must not leave a powered arm behind.
        await anyio.to_thread.run_sync(cameras.connect)
        display = opts.display
        try:
            if display is not None:
                await anyio.to_thread.run_sync(display.start, self.engine.spec, cameras)
            async with anyio.create_task_group() as tg:
                await tg.start(self._run_engine)
                if opts.record_path:
                    recorder = Recorder(
                        opts.record_path,
                        self.engine.spec,
                        client_id=getattr(self.engine, "client_id", ""),
                        task=self.engine.task,
                        image_every=opts.record_images_every,
                        failsafe=self.engine.failsafe,
                    )
                    recorder.start()
                if recorder is not None or display is not None:
                    tg.start_soon(self._feed, recorder, display, cameras)
                await tg.start(loop.run)
                self._loop_started = True
                log.info(
                    "control loop running",
                    robot=self.engine.spec.name,
                    fps=self.engine.spec.fps,
                    where="thread" if in_thread else "process",
                    realtime=loop.statistics().realtime,
                )
                if opts.status is not None:
                    tg.start_soon(show_status, self.engine, loop, opts.status)
                if opts.telemetry is not None and self.engine.zenoh_session is not None:
                    client_id = getattr(self.engine, "client_id", "")
                    tg.start_soon(opts.telemetry.run, self.engine.zenoh_session, self.engine, loop, client_id)
                await self._supervise()
                parked = await self._park()
                await loop.stop()
                if opts.telemetry is not None:  # its last record says goodbye: stopped, not silent
                    opts.telemetry.goodbye = self.stop_reason or "stopped"
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                if recorder is not None or display is not None:
                    self._drain(recorder, display, cameras)
                if recorder is not None:
                    await anyio.to_thread.run_sync(recorder.close)
                if display is not None:
                    await anyio.to_thread.run_sync(display.close)
                await anyio.to_thread.run_sync(cameras.disconnect)
                sys.setswitchinterval(switch_interval)
        summary = self.summary(time.monotonic() - started, parked)
        if opts.summary_path:
            await anyio.to_thread.run_sync(_write_summary, opts.summary_path, summary.to_json())
        return summary

    def _make_loop(self, channel: ControlChannel, cameras: Cameras, in_thread: bool) -> ControlLoop:
        spec, config, opts = self.engine.spec, self.config, self.options
        if in_thread:
            limiter = SafetyLimiter(spec, velocity_scale=self.engine.pipeline.control.velocity_scale)
            parts = (channel, cameras, self.robot.build(), self.engine, limiter)
            return ThreadControlLoop(*parts, task=config.task, realtime=opts.realtime)
        pipeline = self.engine.pipeline
        return ProcessControlLoop(
            channel,
            cameras,
            self.robot,
            action_dim=spec.action_dim,
            pipeline=pipeline.memory,
            control=pipeline.control,
            source=pipeline.source,
            realtime=opts.realtime,
            spin=opts.spin,
            rest_tolerance=opts.rest_tolerance,
            orphan_park_timeout_s=opts.park_timeout_s,
            task=config.task,
        )

    async def _run_engine(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the engine, turning a crash after start-up into DEAD.

        Once the control loop may have moved the arm, the supervisor must still park it; before
        that the error propagates (nothing has moved).
        """
        try:
            await self.engine.run(task_status=task_status)
        except Exception as exc:
            if not self._loop_started:
                raise
            if self.engine.failsafe.dead.is_set():
                log.info("engine stopped", reason=self.engine.failsafe.reason)  # told to: DEAD
                return
            log.exception("engine crashed")
            self.engine.failsafe.fatal(f"engine crashed: {exc!r}")

    async def _supervise(self) -> None:
        duration = self.options.duration_s
        deadline = None if duration is None else time.monotonic() + duration
        loop, failsafe = self.loop, self.engine.failsafe
        assert loop is not None
        while not self._stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                self.request_stop("duration elapsed")
            elif self.engine.is_finished():
                self.request_stop("finished")
            elif fault := loop.fault:
                # The loop holds its last safe command; nothing the engine does can be trusted.
                failsafe.fatal(f"control fault: {fault}")
                self.request_stop(f"control fault: {fault}")
            elif failsafe.dead.is_set():
                self.request_stop(f"engine dead: {failsafe.reason}")
            elif not loop.running:
                failsafe.fatal(f"control loop ended: {loop.error or 'unknown reason'}")
                self.request_stop(f"control loop ended: {loop.error or 'unknown reason'}")
            with anyio.move_on_after(_SUPERVISE_S):
                await self._stop.wait()
        log.info("stopping", reason=self.stop_reason)

    async def _park(self) -> bool:
        loop = self.loop
        assert loop is not None
        if not loop.running:
            return False
        self.engine.begin_teardown()
        rest = np.asarray(self.engine.spec.rest_pose, dtype=np.float32)
        parked = await loop.park(rest, tolerance=self.options.rest_tolerance, timeout=self.options.park_timeout_s)
        log.info(
            "rest pose reached" if parked else "rest pose not reached in time",
            timeout_s=self.options.park_timeout_s,
        )
        return parked

    async def _feed(self, recorder: Recorder | None, display: Display | None, cameras: Cameras) -> None:
        while True:
            self._drain(recorder, display, cameras)
            await anyio.sleep(_DRAIN_S)

    def _drain(self, recorder: Recorder | None, display: Display | None, cameras: Cameras) -> None:
        assert self.loop is not None
        ticks = self.loop.drain()
        if display is not None:
            display.offer(ticks, self.engine.statistics())
        if recorder is not None:
            for tick in ticks:
                if recorder.wants_images(tick.tick):
                    tick.images = cameras.read_cameras()  # the newest frames, at most one drain old
                recorder.record(tick)

    def summary(self, duration_s: float, parked: bool) -> RunSummary:
        """Build the run summary from the loop and engine counters."""
        stats = self.engine.statistics()
        loop = None if self.loop is None else self.loop.statistics()
        return RunSummary(
            ticks=loop.ticks if loop else 0,
            actions_executed=loop.actions_executed if loop else 0,
            fallback_ticks=stats.fallback_ticks,
            chunks_received=stats.chunks_received,
            chunks_dropped=stats.chunks_dropped,
            reconnects=stats.reconnects,
            rtt_ms=_percentiles_ms(self.engine.rtt, ("p50", 0.5), ("p99", 0.99)),
            tick_jitter_ms=loop.lateness_ms if loop else {"p50": None, "p99": None, "max": None},
            final_state=stats.state,
            missed_deadlines=loop.missed_deadlines if loop else 0,
            requests=stats.requests,
            timeouts=stats.timeouts,
            resent=stats.resent,
            errors=stats.errors,
            stale_refusals=stats.stale_refusals,
            network_requests=self.engine.network_requests,
            duration_s=round(duration_s, 3),
            stop_reason=self.stop_reason,
            parked=parked,
            fault=loop.fault if loop else "",
            control_loop="" if self.loop is None else type(self.loop).__name__,
            realtime=loop.realtime if loop else False,
            records_dropped=loop.records_dropped if loop else 0,
            transitions=[[t.state.value, t.reason] for t in self.engine.failsafe.transitions],
            stalls=dict(self.engine.failsafe.stall_causes.most_common()),
            chunks_rejected=stats.chunks_rejected,
            rogue_servers=stats.rogue_servers,
            codec={} if stats.codec is None else dataclasses.asdict(stats.codec),
        )


def _percentiles_ms(tracker: LatencyTracker | None, *points: tuple[str, float]) -> dict[str, float | None]:
    values = None if tracker is None else tracker.percentiles([q for _, q in points])
    if values is None:
        return {name: None for name, _ in points}
    return {name: round(ns / 1e6, 3) for (name, _), ns in zip(points, values, strict=True)}


def _write_summary(path: str, text: str) -> None:
    # Why a robot stopped, its faults and its link's figures are this user's alone, like --record.
    with open(path, "w", encoding="utf-8", opener=private_opener) as file:
        file.write(text)
