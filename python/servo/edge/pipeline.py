"""The RTC contract shared by every engine: request snapshots and exact merges.

Remote and local engines differ only in how a chunk is produced; both go through
`ChunkPipeline.snapshot` before asking and `ChunkPipeline.complete` after, on the same
`servo._core.ActionQueue`. That is what makes remote RTC and local RTC byte-identical on the same
inputs (the golden parity contract).

Every step is executed once. An observation carries the tick it was taken at and the queue's
position then (the control loop stamps both), so the chunk answering it is meant for the steps
from that tick on: its merge counts, at the instant it takes effect, the actions taken since that
position and skips exactly those (RTC) or those and the ones still queued (append), however late
the chunk comes; its RTC prefix is the plan as it stood at that position. Each executed action is
labelled with the step it was meant for (`servo._core.Provenance.step`), which a recording keeps
(`servo.edge.exactness` checks it).

The queue lives in shared memory (`servo.edge.actions.pipeline_layout`): the control loop that
consumes it (`servo.edge.actions.ActionFeed`) may run in another process.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Annotated

import msgspec
import numpy as np
import numpy.typing as npt

from servo._core import ActionQueue, LatencyTracker, Provenance, SharedMemory
from servo.config import NonNegativeInt, Seconds, doc
from servo.edge.actions import (
    COUNTERS,
    EPISODE,
    FALLBACK_TICKS,
    LAST_STARVED_NS,
    STALE_REFUSALS,
    Action,
    ActionFeed,
    ControlConfig,
    Source,
    pipeline_layout,
)
from servo.edge.observation import ObservationInput
from servo.wire import Tuning

FloatArray = npt.NDArray[np.float32]

#: Round trips the delay estimate looks at: a late chunk leaves it within this many requests.
DELAY_WINDOW = 5
#: Nearest-rank quantile of that window: the upper median (the 3rd of 5, the 3rd of 4, the max of 2).
DELAY_QUANTILE = 0.6
#: The next observation leaves while the queue still covers the expected round trip plus a margin:
#: this share of the round trip (its spread grows with it) ...
SEND_MARGIN_SHARE = 0.25
#: ... and at least this much (s): a few control ticks of scheduling noise on either side.
SEND_MARGIN_MIN_S = 0.05
#: Round trips measured before the pipeline judges whether chunks outlast them (`starvation`).
STARVATION_SAMPLES = DELAY_WINDOW // 2 + 1


class PipelineConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[pipeline]`` of the edge configuration: when an engine asks for a chunk and how it is merged."""

    buffer_time_s: Annotated[
        Seconds,
        doc("The next observation leaves at the latest when the queue holds less than this many seconds."),
    ] = 0.5
    rtc: Annotated[bool, doc("Real-time chunking: replace the queue's rest with each chunk (else append).")] = True
    execution_horizon: Annotated[
        NonNegativeInt, doc("Queued steps shipped with each request as the RTC prefix.", le=10_000)
    ] = 10


@dataclass(frozen=True)
class Request:
    """Everything snapshotted when an observation leaves for inference (one in flight)."""

    obs: ObservationInput
    delay_steps: int
    prefix_model: FloatArray | None
    prefix_robot: FloatArray | None
    episode_id: int


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


@dataclass(frozen=True)
class Starvation:
    """Chunks too short for the round trip (`ChunkPipeline.starvation`): the robot falls back between them."""

    chunk_steps: int
    #: The shortest chunk that would keep the queue fed at this round trip.
    needed_steps: int
    round_trip_s: float
    fps: float

    def message(self, tuning: Tuning | None = None) -> str:
        """What happens and the fixes, named as the policy's own options (``tuning``), for the log."""
        tuning = tuning or Tuning()
        return (
            f"a chunk of {self.chunk_steps} steps lasts {self.chunk_steps / self.fps:.2f} s at {self.fps:g} fps, "
            f"too short for a {self.round_trip_s:.2f} s round trip (the steps that pass during a chunk's own "
            "round trip are dropped from it): the queue runs dry every chunk and the "
            f"robot falls back between chunks; serve the policy with {tuning.longer_chunk(self.needed_steps)} or "
            f"{tuning.faster_forward()}, or run the robot at a lower fps"
        )

    def short(self) -> str:
        """The same in a few words, for the status line."""
        return f"chunks too short: {self.chunk_steps} steps, need >= {self.needed_steps}"


class ChunkPipeline:
    """ActionQueue + LatencyTracker + the request/merge discipline.

    The producer side (`snapshot`, `complete`, `reset_episode`) belongs to the engine's inference
    worker. The consumer side is an `ActionFeed` on the control loop, in this process
    (`next_action`, for a control thread and tests) or in the control process, which maps
    ``memory`` (`control` and `source` tell it how). They share only the lock-free queue and
    counters.

    Args:
        action_dim: Joints of the robot.
        fps: Its control rate.
        config: When to ask and how to merge (``[pipeline]``).
        control: What the consumer does with queued actions (``[control]``).
        latency_window: Round trips the latency statistics keep.
        capacity: Most actions the queue holds.
    """

    def __init__(
        self,
        action_dim: int,
        fps: float,
        config: PipelineConfig,
        control: ControlConfig,
        *,
        latency_window: int = 100,
        capacity: int = 4096,
    ) -> None:
        self.action_dim = action_dim
        self.dt_ns = round(1e9 / fps)
        self.execution_horizon = config.execution_horizon
        self.buffer_steps = config.buffer_time_s * fps
        size, counters_at = pipeline_layout(action_dim, capacity)
        #: The queue and the consumer's counters; a control process maps it by its descriptor.
        self.memory = SharedMemory(size)
        self.queue = ActionQueue.create(self.memory, 0, action_dim, rtc=config.rtc, capacity=capacity)
        self.counters = self.memory.counters(counters_at, COUNTERS)
        self.control = control
        #: How executed actions are labelled (`label_actions`).
        self.source: Source = "policy"
        self._feed = ActionFeed(self.queue, self.counters, control)
        self.latency = LatencyTracker(latency_window)
        #: The last `DELAY_WINDOW` round trips: the delay estimate (robust to one outlier).
        self.recent = LatencyTracker(DELAY_WINDOW)
        self.episode_id = 0
        self.last_delay_steps = 0
        self.last_real_delay = 0
        self._lock = threading.Lock()

    @property
    def rtc(self) -> bool:
        """Replace (RTC) or append merging."""
        return bool(self.queue.rtc)

    def set_rtc(self, rtc: bool) -> None:
        """Switch merge mode (the server may downgrade RTC); meant for an empty queue."""
        self.queue.set_rtc(rtc)

    def label_actions(self, source: Source) -> None:
        """Label queued actions as ``source`` when executed ("replay" for trajectory replay).

        Before the control loop starts: the control process reads `source` once.
        """
        self.source = source
        self._feed = ActionFeed(self.queue, self.counters, self.control, source)

    # ------------------------------------------------------------------ consumer counters
    @property
    def fallback_ticks(self) -> int:
        """Ticks that had no fresh action (the control loop's count)."""
        return self.counters.get(FALLBACK_TICKS)

    @property
    def stale_refusals(self) -> int:
        """Actions refused for being older than ``max_action_age_s``."""
        return self.counters.get(STALE_REFUSALS)

    @property
    def last_starved_ns(self) -> int:
        """When the control loop last had no fresh action (0 = never)."""
        return self.counters.get(LAST_STARVED_NS)

    # ------------------------------------------------------------------ producer side
    def send_below(self) -> int:
        """Queue size (steps) under which the next observation leaves.

        The queue must not run dry before the chunk comes back: the expected round trip plus a
        margin (`SEND_MARGIN_SHARE` of it, at least `SEND_MARGIN_MIN_S`), and never less than
        ``buffer_time_s`` (the configured floor; all there is before the first round trip).
        """
        steps = self.buffer_steps
        expected = self.expected_latency_ns()
        if expected is not None:
            lead_ns = expected + max(SEND_MARGIN_SHARE * expected, SEND_MARGIN_MIN_S * 1e9)
            steps = max(steps, lead_ns / self.dt_ns)
        return math.ceil(steps)

    def needs_observation(self) -> bool:
        """True when the queue would run dry before a chunk asked for now is expected back (`send_below`)."""
        return self.queue.qsize() < self.send_below()

    def current(self, obs: ObservationInput) -> bool:
        """Whether ``obs`` was taken since the last merge: only then can its chunk's merge be exact."""
        return self.queue.is_current(obs.position)

    def snapshot(self, obs: ObservationInput) -> Request:
        """Snapshot the RTC prefixes and the delay estimate for ``obs`` (a `current` one).

        The RTC prefix is the queue's plan from the observation's position on (the steps taken
        since included: the chunk's row 0 is meant for the observation's tick), its next
        ``execution_horizon`` steps, or more when the expected delay is longer: the steps that
        execute while the chunk is computed are all part of the conditioning (the server freezes
        the first ``delay_steps`` of the chunk to them).

        Raises:
            QueueError: ``obs`` is not `current`.
        """
        expected = self.expected_latency_ns()
        delay = 0 if expected is None else math.ceil(expected / self.dt_ns)
        self.last_delay_steps = delay
        prefix_model = prefix_robot = None
        if self.rtc and self.execution_horizon > 0:
            horizon = max(self.execution_horizon, delay)
            left = self.queue.get_left_over(since=obs.position)
            left_robot = self.queue.get_processed_left_over(since=obs.position)
            if left is not None and len(left):
                prefix_model = left[:horizon]
            if left_robot is not None and len(left_robot):
                prefix_robot = left_robot[:horizon]
        return Request(obs, delay, prefix_model, prefix_robot, self.episode_id)

    def starvation(self, chunk_steps: int, round_trip_ns: int | None = None) -> Starvation | None:
        """Why chunks of ``chunk_steps`` cannot keep the queue fed, or None when they can.

        One request is in flight at a time, so the next chunk comes back a round trip
        (``round_trip_ns``, else the expected one once `STARVATION_SAMPLES` were measured) after
        this one was merged. What a chunk leaves once merged must cover that round trip, and a
        chunk starts where the robot is when it arrives (the steps that passed during its own
        round trip are dropped, replaced or appended): it must outlast two round trips.
        """
        if round_trip_ns is None and self.recent.count() < STARVATION_SAMPLES:
            return None  # a first round trip or two (cold caches, a thread starting) are no verdict
        rtt = self.expected_latency_ns() if round_trip_ns is None else round_trip_ns
        if rtt is None or rtt <= 0:
            return None
        need = math.ceil(2 * rtt / self.dt_ns)
        if chunk_steps >= need:
            return None
        return Starvation(chunk_steps, need, rtt / 1e9, 1e9 / self.dt_ns)

    def expected_latency_ns(self) -> int | None:
        """The round trip the next chunk is expected to take (ns); None before the first chunk.

        The upper median of the last `DELAY_WINDOW`: one or two late chunks never move it, and a
        lasting change moves it within ``DELAY_WINDOW // 2 + 1`` requests.
        """
        return self.recent.percentile(DELAY_QUANTILE)

    def complete(
        self,
        request: Request,
        chunk_model: FloatArray,
        chunk_robot: FloatArray,
        now_ns: int,
        *,
        session_id: str,
        seq_id: int,
    ) -> int | None:
        """Merge a chunk answering ``request``: exactly, from its observation's position.

        Returns the chunk's leading steps left out (taken, or still queued, since the
        observation), or None if the chunk belongs to an episode that has since been reset
        (dropped).

        Raises:
            QueueError: the chunk does not fit, or another merge came after the observation.
        """
        with self._lock:
            if request.episode_id != self.episode_id:
                return None
            latency = max(0, now_ns - request.obs.mono_ns)
            self.latency.add(latency)
            self.recent.add(latency)
            real_delay = math.ceil(latency / self.dt_ns)
            self.last_real_delay = real_delay
            obs = request.obs
            provenance = Provenance(session_id, seq_id, request.episode_id, obs.mono_ns, obs.tick)
            return int(
                self.queue.merge(chunk_model, chunk_robot, real_delay, provenance=provenance, since=obs.position)
            )

    def reset_episode(self) -> int:
        """Episode boundary: drop queued actions and return the new episode id.

        The latency estimate survives (it is episode-invariant); the control loop forgets its
        last action when it sees the new episode (no ``repeat_last`` across episodes).
        """
        with self._lock:
            self.episode_id += 1
            self.counters.set(EPISODE, self.episode_id)
            self.queue.clear()
            return self.episode_id

    def next_action(self, now_ns: int) -> Action | None:
        """Consume in this process: `ActionFeed.get_action` (a control thread, tests)."""
        return self._feed.get_action(now_ns)

    def queued(self) -> int:
        """Actions left in the queue."""
        return self.queue.qsize()
