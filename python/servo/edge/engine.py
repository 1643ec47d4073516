"""The inference-engine interface the edge runtime drives, and what all engines share.

An engine produces chunks into its pipeline's action queue (shared memory: the control loop,
in its own process, consumes it) from the observations its `ObservationFeed` (the control loop)
hands out. Only the sequential engine is also the control loop's action source: its policy runs
inside the tick (`runs_on_control_loop`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import anyio
import numpy as np
import numpy.typing as npt
import zenoh
from anyio.abc import TaskStatus

from servo._core import LatencyTracker, QueueError
from servo.client import REJECT_REASONS
from servo.client.codec import CodecStatus
from servo.edge.actions import Action
from servo.edge.config import EdgeConfig
from servo.edge.failsafe import EngineState, FailSafe
from servo.edge.observation import ObservationFeed, ObservationInput
from servo.edge.pipeline import ChunkPipeline, Request, Starvation
from servo.logs import get_logger
from servo.robots.protocol import RobotSpec
from servo.transport import LoopBridge
from servo.wire import CameraFeature, Features

log = get_logger(__name__)

#: How often a waiting worker re-evaluates the fail-safe state and its stop conditions.
TICK_S = 0.02
#: Merged chunks whose round trip the run summary covers (fixed memory, whatever the uptime).
RTT_WINDOW = 10_000
#: The session id of chunks computed in this process.
LOCAL_SESSION = "0" * 32


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of an engine's counters.

    ``chunks_rejected`` counts what never reached the queue, by reason (see
    `servo.client.REJECT_REASONS`); ``rogue_servers`` the replicas skipped as untrusted or forged.
    """

    state: str
    chunks_received: int
    chunks_dropped: int
    requests: int
    timeouts: int
    errors: int
    reconnects: int
    fallback_ticks: int
    stale_refusals: int
    queue_depth: int
    delay_steps: int
    rtt_ms_p50: float | None
    rtt_ms_p99: float | None
    chunks_rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REJECT_REASONS, 0))
    rogue_servers: int = 0
    #: Remote engines: the current session's codec choice and what it measured.
    codec: CodecStatus | None = None
    #: Set while chunks are too short for the round trip (`Starvation.short`): the fix is in the log.
    starving: str = ""
    #: Remote engines: the replica serving the robot and its model ("" while there is none).
    replica: str = ""
    model: str = ""


@dataclass(frozen=True)
class Produced:
    """A chunk produced for one request, wherever it was computed (``session_id``: 32 hex chars)."""

    chunk_model: npt.NDArray[np.float32]
    chunk_robot: npt.NDArray[np.float32]
    #: The wire's 16-byte session id as 32 hex characters (`LOCAL_SESSION` for local engines).
    session_id: str
    seq_id: int
    inference_ms: float


@dataclass(frozen=True)
class MergeEvent:
    """One chunk an engine merged.

    ``trimmed`` is None when the chunk was dropped (the episode was reset while it was in
    flight); ``merge_ns`` is the time spent in the queue merge.
    """

    request: Request
    produced: Produced
    now_ns: int
    trimmed: int | None
    merge_ns: int


class InferenceEngine(Protocol):
    """What the edge runtime needs from an engine.

    `run` belongs to the event loop. `get_action` and `queued` make the engine a control loop's
    action source; the control loop calls them once per tick when `runs_on_control_loop` (the
    sequential engine), otherwise the control process reads the pipeline's queue directly. The
    rest may be called from any thread.
    """

    failsafe: FailSafe
    pipeline: ChunkPipeline
    #: The policy runs inside the control tick (sequential mode): the loop must be a thread here.
    runs_on_control_loop: bool

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Produce chunks until cancelled; ``started`` once ready to stream."""
        ...

    def bind(self, feed: ObservationFeed) -> None:
        """Where observations come from (the control loop), before `run`."""
        ...

    def get_action(self, now_ns: int) -> Action | None:
        """Action for this tick (policy or fallback); None = hold."""
        ...

    def queued(self) -> int:
        """Actions left in the queue."""
        ...

    def reset(self) -> None:
        """Episode boundary."""
        ...

    def pause(self) -> None:
        """Stop requesting chunks; the queue keeps draining."""
        ...

    def hurry(self) -> None:
        """Shut down without the waits that do not protect the robot (a second interrupt)."""
        ...

    def resume(self) -> None:
        """Request chunks again."""
        ...

    def begin_teardown(self) -> None:
        """The arm is parking: stop requesting, and never (re)connect from now on."""
        ...

    def statistics(self) -> EngineStats:
        """Counters snapshot."""
        ...


def robot_features(spec: RobotSpec) -> Features:
    """The feature contract a robot offers to a policy."""
    names = list(spec.joint_names)
    return Features(
        state_names=names,
        action_names=names,
        cameras={name: CameraFeature(cam.height, cam.width) for name, cam in spec.cameras.items()},
        state_units=list(spec.units),
        action_units=list(spec.units),
    )


class Aborted(Exception):
    """Waiting for the next request was aborted (session lost, engine dead)."""


class EngineBase:
    """Observation feed, pipeline, fail-safe and counters shared by every engine.

    Owned by the event loop (its `run`), except `get_action` / `queued` (the control thread of
    the sequential engine) and `reset` / `pause` / `resume` / `hurry` (any thread).
    """

    runs_on_control_loop = False

    def __init__(self, config: EdgeConfig, spec: RobotSpec) -> None:
        self.config = config
        self.spec = spec
        self.pipeline = ChunkPipeline(spec.action_dim, spec.fps, config.pipeline, config.control)
        self.failsafe = FailSafe(config.failsafe)
        self.paused = False
        #: Set by a second interrupt: teardown skips waiting on the network.
        self.hurried = False
        #: Set once the safe teardown began: no session may be opened any more.
        self.tearing_down = False
        #: The task the policy runs with: the configured one until a server says otherwise.
        self.task = config.task
        self.chunks_received = 0
        self.chunks_dropped = 0
        self.requests = 0
        self.errors = 0
        #: Requests that crossed the network (replay reports how few it needs).
        self.network_requests = 0
        #: Observation-to-merge latency (ns) of the last `RTT_WINDOW` merged chunks, for the run
        #: summary (the pipeline's own, shorter window drives the delay estimate).
        self.rtt = LatencyTracker(RTT_WINDOW)
        #: Called on the worker after every merge: instrumentation (tests, benchmarks, tracing).
        self.on_merge: Callable[[MergeEvent], None] | None = None
        self.feed: ObservationFeed | None = None
        #: Chunks too short for the round trip, as last checked (`check_chunk_length`).
        self.starving: Starvation | None = None
        self._starvation_said = False
        #: Remote engines: their Zenoh session once `run` opened it (telemetry publishes on it).
        self.zenoh_session: zenoh.Session | None = None
        self._episode_start = True
        self._bridge: LoopBridge | None = None

    def bind(self, feed: ObservationFeed) -> None:
        """Where observations come from (the control loop), before `run`."""
        self.feed = feed

    # ------------------------------------------------------------------ worker side (event loop)
    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Produce chunks until cancelled; ``started`` once ready (each engine implements it)."""
        raise NotImplementedError

    def attach_loop(self) -> None:
        """Bind to the running event loop (first thing `run` does)."""
        self._bridge = LoopBridge()

    def detach_loop(self) -> None:
        """Stop scheduling onto the loop (`run` is ending)."""
        if self._bridge is not None:
            self._bridge.closed = True

    async def wait_until_needed(
        self, abort: Callable[[], str | None] = lambda: None, *, at_once: bool = False
    ) -> ObservationInput:
        """Wait until the next observation should leave and one exists.

        It should leave when the queue would run dry before its chunk is expected back
        (`ChunkPipeline.send_below`), or at once with ``at_once`` (a new session: what is queued
        was computed by a replica the edge no longer uses, and its rest is the RTC prefix).

        Raises:
            Aborted: ``abort()`` returned a reason, or the engine is dead.
        """
        while True:
            reason = abort() or (self.failsafe.reason if self.failsafe.dead.is_set() else None)
            if reason:
                raise Aborted(reason)
            obs = self.latest_observation()
            if obs is not None and not self.paused and (at_once or self.pipeline.needs_observation()):
                return obs
            if self.feed is None or (at_once and not self.paused):
                await anyio.sleep(TICK_S)
            else:
                # Woken by the control loop as soon as the queue drops below the send threshold.
                await self.feed.wait(self.pipeline.send_below(), TICK_S)

    async def tick_failsafe(self) -> None:
        """Evaluate the fail-safe state machine every `TICK_S` until cancelled."""
        while True:
            pipeline = self.pipeline
            self.failsafe.tick(
                starved_since_ns=pipeline.last_starved_ns,
                runway_ns=pipeline.queued() * pipeline.dt_ns,
                expected_rtt_ns=pipeline.expected_latency_ns(),
            )
            await anyio.sleep(TICK_S)

    def latest_observation(self) -> ObservationInput | None:
        """Worker: the newest observation, if any."""
        return None if self.feed is None else self.feed.latest()

    def get_action(self, now_ns: int) -> Action | None:
        """Control thread: next action, staleness-checked, or the fallback."""
        return self.pipeline.next_action(now_ns)

    def queued(self) -> int:
        """Actions left in the queue."""
        return self.pipeline.queued()

    def is_finished(self) -> bool:
        """Whether the engine's work has an end and reached it (trajectory replay)."""
        return False

    @property
    def episode_starting(self) -> bool:
        """Whether the next request opens an episode (no request of this episode left yet)."""
        return self._episode_start

    def take_episode_start(self) -> bool:
        """Worker: whether the next request opens an episode (cleared once read)."""
        start, self._episode_start = self._episode_start, False
        return start

    def reset(self) -> None:
        """Episode boundary: clear the queue, bump the episode, flag the next observation."""
        self.pipeline.reset_episode()
        self._episode_start = True

    def hurry(self) -> None:
        """Teardown skips waiting on the network (the control loop still parks the arm)."""
        self.hurried = True

    def pause(self) -> None:
        """Stop requesting chunks (DAgger intervention); the queue stays intact."""
        self.paused = True

    def resume(self) -> None:
        """Request chunks again."""
        self.paused = False

    def begin_teardown(self) -> None:
        """The arm is parking: stop requesting chunks and never (re)connect from now on."""
        self.tearing_down = True
        self.pause()

    def check_chunk_length(self, chunk_steps: int, round_trip_ns: int | None = None) -> None:
        """Whether chunks of ``chunk_steps`` keep the queue fed (`ChunkPipeline.starvation`); said once."""
        self.starving = self.pipeline.starvation(chunk_steps, round_trip_ns)
        if self.starving is not None and not self._starvation_said:
            self._starvation_said = True
            log.warning("chunks too short for the round trip", advice=self.starving.message())

    def merge(self, request: Request, produced: Produced, now_ns: int) -> int | None:
        """Merge a produced chunk (the same call for every engine).

        Returns the steps trimmed, or None when the chunk was dropped: the episode was reset
        meanwhile, or the queue refused it (a chunk that does not fit: counted in
        ``queue_refusals``, never fatal).
        """
        started = time.perf_counter_ns()
        try:
            trimmed = self.pipeline.complete(
                request,
                produced.chunk_model,
                produced.chunk_robot,
                now_ns,
                session_id=produced.session_id,
                seq_id=produced.seq_id,
            )
        except QueueError as exc:  # counted as dropped; the next request brings another chunk
            log.warning("chunk refused by the queue", error=str(exc), seq_id=produced.seq_id)
            trimmed = None
        if self.on_merge is not None:
            self.on_merge(MergeEvent(request, produced, now_ns, trimmed, time.perf_counter_ns() - started))
        if trimmed is None:
            self.chunks_dropped += 1
            return None
        self.chunks_received += 1
        self.rtt.add(max(0, now_ns - request.obs.mono_ns))
        self.failsafe.merged()
        self.check_chunk_length(len(produced.chunk_robot))
        return trimmed

    def statistics(self) -> EngineStats:
        """Counters snapshot."""
        p50, p99 = self.pipeline.latency.percentiles([0.5, 0.99]) or (None, None)
        return EngineStats(
            state=self.failsafe.state.value,
            chunks_received=self.chunks_received,
            chunks_dropped=self.chunks_dropped,
            requests=self.requests,
            timeouts=self.failsafe.timeouts,
            errors=self.errors,
            reconnects=self.failsafe.reconnects,
            fallback_ticks=self.pipeline.fallback_ticks,
            stale_refusals=self.pipeline.stale_refusals,
            queue_depth=self.pipeline.queue.qsize(),
            delay_steps=self.pipeline.last_delay_steps,
            rtt_ms_p50=None if p50 is None else p50 / 1e6,
            rtt_ms_p99=None if p99 is None else p99 / 1e6,
            starving="" if self.starving is None else self.starving.short(),
        )

    @property
    def state(self) -> EngineState:
        """Current fail-safe state."""
        return self.failsafe.state
