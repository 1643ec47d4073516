"""The inference engine the edge runtime drives: one loop, written once, and what engines share.

An engine produces chunks into its pipeline's action queue (shared memory: the control loop,
in its own process, consumes it) from the observations its `ObservationFeed` (the control loop)
hands out. `EngineBase` owns the loop::

    wait until a chunk is needed -> snapshot the queue -> produce -> merge
                                                    └─ failed: servo.edge.failures

and each engine implements only what differs: `EngineBase.produce` (over the network, on a
thread, from a trajectory) and its set-up. Only the sequential engine is also the control loop's
action source: its policy runs inside the tick (`runs_on_control_loop`).
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Callable

import anyio
import zenoh
from anyio.abc import TaskGroup, TaskStatus

from servo._core import LatencyTracker, QueueError
from servo.edge.actions import Action
from servo.edge.config import EdgeConfig
from servo.edge.failsafe import EngineState, FailSafe
from servo.edge.failures import Failures, SessionEnded
from servo.edge.observation import ObservationFeed, ObservationInput
from servo.edge.pipeline import ChunkPipeline, MergeEvent, Produced, Request, Starvation
from servo.edge.stats import EngineStats
from servo.logs import get_logger
from servo.robots.protocol import RobotSpec
from servo.stages import LoopBridge
from servo.wire import Tuning

log = get_logger(__name__)

#: How often a waiting worker re-evaluates the fail-safe state and its stop conditions.
TICK_S = 0.02
#: Merged chunks whose round trip the run summary covers (fixed memory, whatever the uptime).
RTT_WINDOW = 10_000
#: The session id of chunks computed in this process.
LOCAL_SESSION = "0" * 32


class EngineBase(abc.ABC):
    """The engine loop (wait -> snapshot -> produce -> merge), its failure classification and counters.

    An engine implements `produce` (one chunk for one request) and, as it needs, `start` (what must
    work before the robot may move: a session, a loaded policy, a trajectory; what it acquires goes
    on `resources`) and `serve` (what runs the loop: the remote engine's reconnects). `run` and the
    loop belong to the event loop, except `get_action` / `queued` (the control thread of the
    sequential engine) and `reset` / `pause` / `resume` / `hurry` (any thread).

    Args:
        config: Edge options (the pipeline, control and fail-safe sections go to their components).
        spec: The robot.
        client_id: This robot's id (default: ``client_id`` of the options, else ``<robot>-local``).
    """

    #: The policy runs inside the control tick (sequential mode): the loop must be a thread here.
    runs_on_control_loop = False

    def __init__(self, config: EdgeConfig, spec: RobotSpec, *, client_id: str = "") -> None:
        self.config = config
        self.spec = spec
        self.client_id = client_id or config.client_id or f"{spec.name}-local"
        self.pipeline = ChunkPipeline(spec.action_dim, spec.fps, config.pipeline, config.control)
        self.failsafe = FailSafe(config.failsafe)
        #: Bound to the robot (and, for a remote engine, its session).
        self.log = log.bind(client_id=self.client_id)
        self.failures = Failures(self.failsafe, self.log)
        self.paused = False
        #: Set by a second interrupt: teardown skips waiting on the network.
        self.hurried = False
        #: Set once the safe teardown began: no session may be opened any more.
        self.tearing_down = False
        #: Set once everything there is to produce is queued (the end of a trajectory).
        self.all_queued = False
        #: The task the policy runs with: the configured one until a server says otherwise.
        self.task = config.task
        self.chunks_received = self.chunks_dropped = self.requests = 0
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
        #: The served policy's own options named in advice (the session ack's; local: the policy's).
        self.tuning = Tuning()
        self._starvation_said = False
        #: Remote engines: their Zenoh session once `run` opened it (telemetry publishes on it).
        self.zenoh_session: zenoh.Session | None = None
        self._episode_start = True
        self._bridge: LoopBridge | None = None
        #: The task group of `run`: background work of the engine (server resets).
        self._tasks: TaskGroup | None = None
        #: What `start` acquired (a Zenoh session, declarations): released, shielded, when `run` ends.
        self.resources = contextlib.AsyncExitStack()

    # ------------------------------------------------------------------ what an engine implements
    @abc.abstractmethod
    async def produce(self, request: Request, *, episode_start: bool) -> Produced | None:
        """The chunk answering ``request``; None when an episode reset abandoned it.

        Raises:
            Exception: a failure `servo.edge.failures` classifies (timeouts, server errors, a lost
                session, `PolicyFailed`); anything else is an engine bug and ends the run (DEAD).
        """

    async def start(self) -> None:
        """Be ready to stream before ``started`` (nothing moves before); overrides end by calling this.

        Raises:
            EdgeStartError: it cannot be (no server, a policy or trajectory that does not fit).
        """
        self.failsafe.session_opened()

    async def serve(self) -> None:
        """Run the loop until DEAD; once everything is queued, idle while the queue drains."""
        await self.stream()
        if self.all_queued:
            await anyio.sleep_forever()

    # ------------------------------------------------------------------ the loop (event loop)
    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start, report ``started``, serve until cancelled or DEAD; always release `resources`.

        Raises:
            EdgeStartError: `start` failed (nothing has moved).
        """
        self._bridge = LoopBridge()
        try:
            async with anyio.create_task_group() as tg:
                self._tasks = tg
                await self.start()
                tg.start_soon(self.tick_failsafe)
                task_status.started()
                await self.serve()
                tg.cancel_scope.cancel()
        finally:
            self._bridge.close()
            with anyio.CancelScope(shield=True):
                await self.resources.aclose()

    async def stream(self, abort: Callable[[], str | None] = lambda: None, *, at_once: bool = False) -> None:
        """The loop: wait until a chunk is needed, snapshot, produce, merge; until DEAD or all is queued.

        Args:
            abort: Returns why the session is over (checked while waiting), or None.
            at_once: Ask at once the first time (a new session), whatever the queue holds.

        Raises:
            SessionEnded: ``abort()`` gave a reason, or the failures say the session is gone.
        """
        while not self.all_queued:
            obs = await self.wait_until_needed(abort, at_once=at_once)
            if obs is None:
                return  # DEAD
            at_once = False
            request = self.pipeline.snapshot(obs)
            try:
                produced = await self.produce(request, episode_start=self.take_episode_start())
            except Exception as exc:
                self.failures.failed(exc)
            else:
                self.deliver(request, produced)
            await anyio.lowlevel.checkpoint()  # a produce that never awaits must not starve the loop

    def deliver(self, request: Request, produced: Produced | None) -> int | None:
        """What follows a successful `produce`: the merge (the steps trimmed), or None if abandoned."""
        self.failures.succeeded()
        if produced is None:
            # An episode reset abandoned this request; its chunk would be dropped anyway.
            self.failsafe.request_failed()
            return None
        trimmed = self.merge(request, produced, time.monotonic_ns())
        self.log.debug("chunk merged", seq_id=produced.seq_id, trimmed=trimmed)
        return trimmed

    def bind(self, feed: ObservationFeed) -> None:
        """Where observations come from (the control loop), before `run`."""
        self.feed = feed

    async def wait_until_needed(
        self, abort: Callable[[], str | None] = lambda: None, *, at_once: bool = False
    ) -> ObservationInput | None:
        """Wait until the next observation should leave and one exists; None once DEAD.

        It should leave when the queue would run dry before its chunk is expected back
        (`ChunkPipeline.send_below`), or at once with ``at_once`` (a new session: what is queued
        was computed by a replica the edge no longer uses, and its rest is the RTC prefix). Only
        an observation taken since the last merge leaves (`ChunkPipeline.current`: its chunk's
        merge is exact); one taken before waits for the next tick's.

        Raises:
            SessionEnded: ``abort()`` returned a reason.
        """
        while not self.failsafe.dead.is_set():
            reason = abort()
            if reason:
                raise SessionEnded(reason)
            obs = self.latest_observation()
            pipeline = self.pipeline
            if (
                obs is not None
                and not self.paused
                and (at_once or pipeline.needs_observation())
                and pipeline.current(obs)
            ):
                return obs
            if self.feed is None or (at_once and not self.paused):
                await anyio.sleep(TICK_S)
            else:
                # Woken by the control loop as soon as the queue drops below the send threshold.
                await self.feed.wait(self.pipeline.send_below(), TICK_S)
        return None

    async def tick_failsafe(self) -> None:
        """Evaluate the fail-safe state machine every `TICK_S` until cancelled.

        Not once everything is queued: the end of a trajectory is not a starved link.
        """
        while not self.all_queued:
            pipeline = self.pipeline
            self.failsafe.tick(
                starved_since_ns=pipeline.last_starved_ns,
                runway_ns=pipeline.queued() * pipeline.dt_ns,
                expected_rtt_ns=pipeline.expected_latency_ns(),
                why_starved=self.why_starved,
            )
            await anyio.sleep(TICK_S)

    def why_starved(self) -> str:
        """Why the control loop has no fresh action, as far as this edge can tell (for the summary)."""
        if self.paused:
            return "requests paused"
        if self.starving is not None:
            return f"{self.starving.short()}: each chunk runs out before the next can be back"
        out, rtt = self.failsafe.outstanding_ns(), self.pipeline.expected_latency_ns()
        if out is None:
            return "no request in flight: the last one failed or timed out, or none could be sent"
        if rtt is None or out > rtt:
            usual = "" if rtt is None else f", round trips took {rtt / 1e9:.2f} s"
            return (
                f"a chunk is late: its request has been out {out / 1e9:.2f} s{usual} (the server or the link is slow)"
            )
        return (
            f"the request left too late: out {out / 1e9:.2f} s of a {rtt / 1e9:.2f} s round trip when the queue ran "
            "dry (raise --buffer-time-s)"
        )

    def latest_observation(self) -> ObservationInput | None:
        """Worker: the newest observation, if any."""
        return None if self.feed is None else self.feed.latest()

    def get_action(self, now_ns: int) -> Action | None:
        """Control thread: next action, staleness-checked, or the fallback."""
        return self.pipeline.next_action(now_ns)

    def queued(self) -> int:
        """Actions left in the queue."""
        return self.pipeline.queued()

    def position(self) -> int:
        """Control thread: where it stands in the queue."""
        return self.pipeline.queue.get_position()

    def is_finished(self) -> bool:
        """Whether the engine's work has an end and reached it: all queued and executed (replay)."""
        return self.all_queued and self.pipeline.queue.empty()

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
            log.warning("chunks too short for the round trip", advice=self.starving.message(self.tuning))

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
            errors=self.failures.errors,
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
