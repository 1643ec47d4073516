"""The RTC contract shared by every engine.

Request snapshots, latency-aware merges, and the control loop's side of the queue (staleness
bound and fallback ladder).

Remote and local engines differ only in how a chunk is produced; both go through
`ChunkPipeline.snapshot` before asking and `ChunkPipeline.complete` after, on the same
`servo._core.ActionQueue`. That is what makes remote RTC and local RTC byte-identical on the same
inputs (the golden parity contract).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from servo._core import ActionQueue, LatencyTracker, Provenance
from servo.edge.observation import ObservationInput

FloatArray = npt.NDArray[np.float32]
Source = Literal["policy", "fallback", "replay"]
Fallback = Literal["hold", "repeat_last", "zero"]


@dataclass(frozen=True)
class Request:
    """Everything snapshotted when an observation leaves for inference (one in flight)."""

    obs: ObservationInput
    idx_before: int
    delay_steps: int
    prefix_model: FloatArray | None
    prefix_robot: FloatArray | None
    episode_id: int


@dataclass(frozen=True)
class Action:
    """What the control loop executes this tick."""

    values: FloatArray
    source: Source
    provenance: Provenance | None


class ChunkPipeline:
    """ActionQueue + LatencyTracker + the request/merge discipline.

    The producer side (`snapshot`, `complete`) belongs to the engine's inference worker; the
    consumer side (`next_action`) to the control-loop thread. They share only the lock-free
    queue and a few scalars.
    """

    def __init__(
        self,
        action_dim: int,
        fps: float,
        *,
        rtc: bool,
        execution_horizon: int,
        buffer_time_s: float,
        max_action_age_s: float,
        fallback: Fallback,
        latency_window: int = 100,
    ) -> None:
        self.action_dim = action_dim
        self.dt_ns = round(1e9 / fps)
        self.execution_horizon = execution_horizon
        self.buffer_steps = buffer_time_s * fps
        self.max_age_ns = round(max_action_age_s * 1e9)
        self.fallback = fallback
        self.queue = ActionQueue(action_dim, rtc=rtc)
        self.latency = LatencyTracker(latency_window)
        self.episode_id = 0
        self.last_delay_steps = 0
        self.last_real_delay = 0
        # Counters written by the control-loop thread only.
        self.stale_refusals = 0
        self.fallback_ticks = 0
        self.last_starved_ns = 0
        #: What queued actions are labelled as when executed ("replay" for trajectory replay).
        self.source_label: Source = "policy"
        self._last_action: FloatArray | None = None
        self._zero = np.zeros(action_dim, dtype=np.float32)
        self._lock = threading.Lock()

    @property
    def rtc(self) -> bool:
        """Replace (RTC) or append merging."""
        return bool(self.queue.rtc)

    def set_rtc(self, rtc: bool) -> None:
        """Switch merge mode (the server may downgrade RTC); only while the queue is empty."""
        if rtc != self.rtc:
            self.queue = ActionQueue(self.action_dim, rtc=rtc)

    # ------------------------------------------------------------------ producer side
    def needs_observation(self) -> bool:
        """True when the queue holds less than ``buffer_time_s`` of actions."""
        return self.queue.qsize() < self.buffer_steps

    def snapshot(self, obs: ObservationInput) -> Request:
        """Snapshot the queue index, the RTC prefixes and the delay estimate for ``obs``."""
        idx_before = self.queue.get_action_index()
        worst = self.latency.max()
        delay = 0 if worst is None else math.ceil(worst / self.dt_ns)
        self.last_delay_steps = delay
        prefix_model = prefix_robot = None
        if self.rtc and self.execution_horizon > 0:
            left = self.queue.get_left_over()
            left_robot = self.queue.get_processed_left_over()
            if left is not None and len(left):
                prefix_model = left[: self.execution_horizon]
            if left_robot is not None and len(left_robot):
                prefix_robot = left_robot[: self.execution_horizon]
        return Request(obs, idx_before, delay, prefix_model, prefix_robot, self.episode_id)

    def complete(
        self,
        request: Request,
        chunk_model: FloatArray,
        chunk_robot: FloatArray,
        now_ns: int,
        *,
        session_id: int,
        seq_id: int,
    ) -> int | None:
        """Merge a chunk answering ``request``.

        Returns the steps trimmed, or None if the chunk belongs to an episode that has since been
        reset (dropped).
        """
        with self._lock:
            if request.episode_id != self.episode_id:
                return None
            latency = max(0, now_ns - request.obs.mono_ns)
            self.latency.add(latency)
            real_delay = math.ceil(latency / self.dt_ns)
            self.last_real_delay = real_delay
            provenance = Provenance(session_id, seq_id, request.episode_id, request.obs.mono_ns)
            return int(
                self.queue.merge(chunk_model, chunk_robot, real_delay, request.idx_before, provenance=provenance)
            )

    def reset_episode(self) -> int:
        """Episode boundary: drop queued actions and return the new episode id.

        The latency estimate survives (it is episode-invariant).
        """
        with self._lock:
            self.episode_id += 1
            self.queue.clear()
            self._last_action = None
            return self.episode_id

    # ------------------------------------------------------------------ consumer side (control loop)
    def next_action(self, now_ns: int) -> Action | None:
        """The action for this tick, or the fallback; None means hold (send nothing).

        Never executes an action whose observation is older than ``max_action_age_s``: a stale
        head means the whole rest of its chunk is stale too, so the queue is cleared.
        """
        item = self.queue.get_with_provenance()
        if item is not None:
            values, provenance = item
            if provenance is None or now_ns - provenance.obs_mono_ns <= self.max_age_ns:
                self._last_action = values
                return Action(values, self.source_label, provenance)
            self.stale_refusals += 1
            # The rest of a stale chunk is stale too; but a fresh chunk merged since the pop
            # must survive (the lock orders this with `complete`, held for a merge's copy only).
            with self._lock:
                if self.queue.peek_provenance() in (None, provenance):
                    self.queue.clear()
        self.fallback_ticks += 1
        self.last_starved_ns = now_ns
        if self.fallback == "zero":
            return Action(self._zero, "fallback", None)
        if self.fallback == "repeat_last" and self._last_action is not None:
            return Action(self._last_action, "fallback", None)
        return None
