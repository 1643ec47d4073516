"""The edge runtime: robot + engine + control loop, supervised until a stop condition.

Then a safe teardown (rest pose, disconnect) and a run summary.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import numpy as np
from anyio.abc import TaskStatus

from servo._core import LatencyTracker
from servo.config import ConfigError
from servo.edge.config import EdgeConfig
from servo.edge.control_loop import ControlLoop
from servo.edge.engine import EngineBase
from servo.edge.failsafe import EngineState
from servo.edge.recorder import Recorder
from servo.edge.safety import SafetyLimiter
from servo.logs import get_logger
from servo.robots.protocol import Robot

log = get_logger(__name__)

#: Supervision period: how quickly a stop condition is noticed.
_SUPERVISE_S = 0.05


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
    rest_tolerance: float = 2.0
    park_timeout_s: float = 5.0
    #: Ask for real-time (SCHED_FIFO) scheduling of the control thread (best effort).
    realtime: bool = True
    #: Python's GIL switch interval while running (None keeps the default 5 ms): a control tick
    #: that wakes while a camera or network thread holds the GIL waits up to this long.
    switch_interval_s: float | None = 0.001


@dataclass
class RunSummary:
    """What happened during a run (written as JSON with ``--summary``).

    ``rtt_ms`` and the jitter percentiles cover the last `EngineBase.rtt` / `ControlLoop.jitter`
    window (fixed memory however long the run); ``tick_jitter_ms["max"]`` and the counters cover
    the whole run.
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
    errors: int = 0
    stale_refusals: int = 0
    network_requests: int = 0
    duration_s: float = 0.0
    stop_reason: str = ""
    parked: bool = False
    transitions: list[list[str]] = field(default_factory=list)

    def to_json(self) -> str:
        """Pretty JSON."""
        return json.dumps(self.__dict__, indent=2)


class EdgeRuntime:
    """Supervises one robot run. Owned by the event loop.

    Args:
        robot: The (not yet connected) robot.
        engine: The inference engine (remote or local).
        config: Edge options.
        options: Run options.
    """

    def __init__(self, robot: Robot, engine: EngineBase, config: EdgeConfig, options: RunOptions) -> None:
        self.robot = robot
        self.engine = engine
        self.config = config
        self.options = options
        self.loop: ControlLoop | None = None
        #: Handed to the control loop: called on its thread with (tick, lateness ns) every tick.
        self.on_tick: Callable[[int, int], None] | None = None
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
        """Run until duration, signal, DEAD or a control-loop failure; always tears down safely.

        Raises:
            EdgeStartError: the engine could not start (nothing has moved).
            ConfigError: the recording would replace an existing file (nothing has moved).
        """
        opts = self.options
        if opts.record_path and not opts.record_overwrite and await anyio.Path(opts.record_path).exists():
            raise ConfigError(f"--record: {opts.record_path} exists; pass --overwrite to replace it")
        await anyio.to_thread.run_sync(self.robot.connect)
        started = time.monotonic()
        recorder = None
        parked = False
        switch_interval = sys.getswitchinterval()
        if opts.switch_interval_s is not None:
            sys.setswitchinterval(opts.switch_interval_s)
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(self._run_engine)
                if opts.record_path:
                    recorder = Recorder(
                        opts.record_path,
                        self.robot.spec,
                        client_id=getattr(self.engine, "client_id", ""),
                        task=self.config.task,
                        image_every=opts.record_images_every,
                    )
                    recorder.start()
                self.loop = ControlLoop(
                    self.robot,
                    self.engine,
                    SafetyLimiter(self.robot.spec, velocity_scale=self.config.velocity_scale),
                    recorder=recorder,
                    task=self.config.task,
                    realtime=opts.realtime,
                    on_tick=self.on_tick,
                )
                self.loop.start()
                log.info("control loop running", robot=self.robot.spec.name, fps=self.robot.spec.fps)
                if opts.status is not None:
                    tg.start_soon(self._status_line, opts.status)
                await self._supervise()
                parked = await self._park()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                if self.loop is not None:
                    await anyio.to_thread.run_sync(self.loop.stop)
                if recorder is not None:
                    await anyio.to_thread.run_sync(recorder.close)
                await anyio.to_thread.run_sync(self.robot.disconnect)
                sys.setswitchinterval(switch_interval)
        summary = self.summary(time.monotonic() - started, parked)
        if opts.summary_path:
            await anyio.Path(opts.summary_path).write_text(summary.to_json())
        return summary

    async def _run_engine(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the engine, turning a crash after start-up into DEAD.

        Once the control loop may have moved the arm, the supervisor must still park it; before
        that the error propagates (nothing has moved).
        """
        try:
            await self.engine.run(task_status=task_status)
        except Exception as exc:
            if self.loop is None:
                raise
            log.exception("engine crashed")
            self.engine.failsafe.fatal(f"engine crashed: {exc!r}")

    async def _supervise(self) -> None:
        duration = self.options.duration_s
        deadline = None if duration is None else time.monotonic() + duration
        assert self.loop is not None
        while not self._stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                self.request_stop("duration elapsed")
            elif self.engine.is_finished():
                self.request_stop("finished")
            elif self.engine.failsafe.dead.is_set():
                self.request_stop(f"engine dead: {self.engine.failsafe.reason}")
            elif not self.loop.running:
                self.request_stop(f"control loop stopped: {self.loop.error!r}")
            with anyio.move_on_after(_SUPERVISE_S):
                await self._stop.wait()
        log.info("stopping", reason=self.stop_reason)

    async def _park(self) -> bool:
        assert self.loop is not None
        if not self.loop.running:
            return False
        self.engine.pause()
        rest = np.asarray(self.robot.spec.rest_pose, dtype=np.float32)
        parked = await anyio.to_thread.run_sync(
            lambda: self.loop.park(rest, tolerance=self.options.rest_tolerance, timeout=self.options.park_timeout_s)  # type: ignore[union-attr]
        )
        log.info(
            "rest pose reached" if parked else "rest pose not reached in time",
            timeout_s=self.options.park_timeout_s,
        )
        return bool(parked)

    def summary(self, duration_s: float, parked: bool) -> RunSummary:
        """Build the run summary from the loop and engine counters."""
        loop, stats = self.loop, self.engine.statistics()
        jitter = _percentiles_ms(loop.jitter if loop else None, ("p50", 0.5), ("p99", 0.99))
        jitter["max"] = round(loop.max_jitter_ns / 1e6, 3) if loop is not None and loop.ticks else None
        return RunSummary(
            ticks=loop.ticks if loop else 0,
            actions_executed=loop.actions_executed if loop else 0,
            fallback_ticks=stats.fallback_ticks,
            chunks_received=stats.chunks_received,
            chunks_dropped=stats.chunks_dropped,
            reconnects=stats.reconnects,
            rtt_ms=_percentiles_ms(self.engine.rtt, ("p50", 0.5), ("p99", 0.99)),
            tick_jitter_ms=jitter,
            final_state=stats.state,
            missed_deadlines=loop.missed_deadlines if loop else 0,
            requests=stats.requests,
            timeouts=stats.timeouts,
            errors=stats.errors,
            stale_refusals=stats.stale_refusals,
            network_requests=self.engine.network_requests,
            duration_s=round(duration_s, 3),
            stop_reason=self.stop_reason,
            parked=parked,
            transitions=[[state.value, reason] for state, reason in self.engine.failsafe.transitions],
        )

    async def _status_line(self, show: Callable[[str], None]) -> None:
        while True:
            stats = self.engine.statistics()
            loop = self.loop
            p99_ns = loop.recent_jitter.percentile(0.99) if loop else None
            p99 = "-" if p99_ns is None else f"{p99_ns / 1e6:.2f}"
            rtt = f"{stats.rtt_ms_p50:.1f}" if stats.rtt_ms_p50 is not None else "-"
            show(
                f"[{stats.state.upper()}] rtt {rtt} ms | delay {stats.delay_steps} | queue {stats.queue_depth} | "
                f"fallback {stats.fallback_ticks} | jitter p99 {p99} ms | ticks {loop.ticks if loop else 0}"
            )
            if self.engine.state is EngineState.DEAD:
                return
            await anyio.sleep(0.25)


def _percentiles_ms(tracker: LatencyTracker | None, *points: tuple[str, float]) -> dict[str, float | None]:
    values = None if tracker is None else tracker.percentiles([q for _, q in points])
    if values is None:
        return {name: None for name, _ in points}
    return {name: round(ns / 1e6, 3) for (name, _), ns in zip(points, values, strict=True)}
