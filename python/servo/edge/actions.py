"""The control loop's side of the action queue: one action per tick, the staleness bound, the fallback ladder.

It runs wherever the tick runs (the edge's control process, or the sequential engine's control
thread), on the `servo._core.ActionQueue` the engine merges into. The queue and this side's
counters share one `servo._core.SharedMemory` block, laid out by `pipeline_layout`::

    [ ActionQueue (ActionQueue.shared_size bytes) | fallback ticks | stale refusals | last starved ns | episode ]

so the engine's `servo.edge.pipeline.ChunkPipeline` reads the counters and tells this side about
episode boundaries without a message: the control process maps the same block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, Protocol

import msgspec
import numpy as np
import numpy.typing as npt

from servo._core import ActionQueue, Counters, Provenance, SharedMemory
from servo.config import PositiveFloat, Seconds, doc

FloatArray = npt.NDArray[np.float32]
Source = Literal["policy", "fallback", "replay"]
Fallback = Literal["hold", "repeat_last", "zero"]

#: Counters after the queue (written by the control loop, except EPISODE: by the engine).
FALLBACK_TICKS, STALE_REFUSALS, LAST_STARVED_NS, EPISODE = range(4)
COUNTERS = 4


def pipeline_layout(action_dim: int, capacity: int) -> tuple[int, int]:
    """(total bytes, offset of the counters) of a pipeline's shared block."""
    queue = ActionQueue.shared_size(action_dim, capacity)
    return queue + Counters.size(COUNTERS), queue


@dataclass(frozen=True)
class Action:
    """What the control loop executes this tick."""

    values: FloatArray
    source: Source
    provenance: Provenance | None


class ActionSource(Protocol):
    """Where a control tick gets its action; owned by the control loop's thread."""

    def get_action(self, now_ns: int) -> Action | None:
        """The action for this tick (policy or fallback); None means hold (send nothing)."""
        ...

    def queued(self) -> int:
        """Actions left in the queue."""
        ...

    def position(self) -> int:
        """Where the queue's consumer stands, read with each observation (`ActionQueue.get_position`)."""
        ...


class ControlConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[control]`` of the edge configuration: what the control loop does with queued actions.

    The control loop takes it as is (it crosses to the control process as JSON).
    """

    max_action_age_s: Annotated[
        Seconds, doc("Never execute an action whose observation is older than this (staleness bound, s).")
    ] = 3.0
    fallback: Annotated[
        Fallback, doc("What the robot does when no fresh action exists: hold, repeat_last or zero.")
    ] = "hold"
    velocity_scale: Annotated[
        PositiveFloat, doc("Scales every joint's velocity limit (below 1 slows every motion down).", le=10)
    ] = 1.0


class ActionFeed:
    """Pops one action per tick, refuses stale ones and falls back. Owned by the control loop's thread.

    Args:
        queue: The engine's queue (this handle is the consumer's).
        counters: The pipeline block's `COUNTERS` counters.
        config: Staleness bound and fallback.
        source: How queued actions are labelled when executed.
    """

    def __init__(
        self, queue: ActionQueue, counters: Counters, config: ControlConfig, source: Source = "policy"
    ) -> None:
        self.queue = queue
        self.config = config
        self.source = source
        self._counters = counters
        self._max_age_ns = round(config.max_action_age_s * 1e9)
        self._zero = np.zeros(queue.action_dim, dtype=np.float32)
        self._last_action: FloatArray | None = None
        self._episode = counters.get(EPISODE)

    @classmethod
    def attach(cls, memory: SharedMemory, config: ControlConfig, source: Source = "policy") -> ActionFeed:
        """The feed of a pipeline block another process created (see `pipeline_layout`).

        Raises:
            ValueError: ``memory`` holds no action queue, or is too small.
        """
        queue = ActionQueue.attach(memory, 0)
        _, counters_at = pipeline_layout(queue.action_dim, queue.capacity)
        return cls(queue, memory.counters(counters_at, COUNTERS), config, source)

    def queued(self) -> int:
        """Actions left in the queue."""
        return self.queue.qsize()

    def position(self) -> int:
        """Where this consumer stands in the queue."""
        return self.queue.get_position()

    def get_action(self, now_ns: int) -> Action | None:
        """The action for this tick, or the fallback; None means hold (send nothing).

        Never executes an action whose observation is older than ``max_action_age_s``: a stale
        head means the whole rest of its chunk is stale too, so that chunk is discarded (a fresher
        chunk merged meanwhile survives: `ActionQueue.discard_chunk` decides atomically).
        """
        counters = self._counters
        episode = counters.get(EPISODE)
        if episode != self._episode:
            # Never repeat an action of the previous episode.
            self._episode, self._last_action = episode, None
        item = self.queue.get_with_provenance()
        if item is not None:
            values, provenance = item
            if provenance is None or now_ns - provenance.obs_mono_ns <= self._max_age_ns:
                self._last_action = values
                return Action(values, self.source, provenance)
            counters.add(STALE_REFUSALS)
            self.queue.discard_chunk(provenance)
        counters.add(FALLBACK_TICKS)
        counters.set(LAST_STARVED_NS, now_ns)
        if self.config.fallback == "zero":
            return Action(self._zero, "fallback", None)
        if self.config.fallback == "repeat_last" and self._last_action is not None:
            return Action(self._last_action, "fallback", None)
        return None
