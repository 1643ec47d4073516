"""Test policies implementing the `servo.policy.Policy` protocol, injected into servers.

None of them imports torch. Each documents which thread touches what: the server calls
``predict_chunk`` and the processors from its inference worker thread only; tests read the
recorded fields from the event loop, so anything shared is guarded by a lock or an Event.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from servo.policy import DecodedObservation, PolicySpec, Prepared
from servo.wire import CameraFeature, Features

JOINTS = ("j0", "j1", "j2", "j3", "j4", "j5")
CHUNK = 10
FPS = 30.0


def make_spec(
    *,
    cameras: dict[str, tuple[int, int]] | None = None,
    joints: tuple[str, ...] = JOINTS,
    chunk_size: int = CHUNK,
    fps: float = FPS,
    supports_rtc: bool = False,
    chunk_stateless: bool = True,
    model: str = "test/policy",
    units: list[str] | None = None,
) -> PolicySpec:
    cams = {"front": (24, 32)} if cameras is None else cameras
    return PolicySpec(
        model=model,
        revision="t1",
        features=Features(
            state_names=list(joints),
            action_names=list(joints),
            cameras={name: CameraFeature(h, w) for name, (h, w) in cams.items()},
            state_units=list(units or []),
            action_units=list(units or []),
        ),
        chunk_size=chunk_size,
        fps=fps,
        supports_rtc=supports_rtc,
        chunk_stateless=chunk_stateless,
    )


class RelativeProcessor:
    """Caches the state at preprocess and adds it at postprocess (within one request)."""

    def __init__(self) -> None:
        self.state: np.ndarray | None = None

    def preprocess(self, obs: DecodedObservation) -> Prepared:
        self.state = np.array(obs.state, dtype=np.float32)
        return Prepared(batch={"state": self.state, "images": obs.images}, prefix=obs.prefix_model)

    def postprocess(self, chunk: np.ndarray) -> np.ndarray:
        assert self.state is not None
        return chunk + self.state

    def reset(self) -> None:
        self.state = None


class FixedComputePolicy:
    """Every forward takes ``compute_ms`` (a sleep: releases the GIL like a GPU forward).

    The model-space chunk is ``step * 0.01`` in every column, so ``chunk_robot[0] == state``.
    ``served`` lists ``int(state[0])`` of every request in service order (worker thread writes,
    tests read after the server drained).
    """

    def __init__(self, compute_ms: float = 0.0, **spec: Any) -> None:
        self._spec = make_spec(**spec)
        self.compute_s = compute_ms / 1e3
        self.served: list[int] = []
        self.resets = 0
        steps = np.arange(self._spec.chunk_size, dtype=np.float32)[:, None] * np.float32(0.01)
        self._chunk = np.repeat(steps, len(self._spec.features.action_names), axis=1)

    @property
    def spec(self) -> PolicySpec:
        return self._spec

    def make_processor(self) -> RelativeProcessor:
        return RelativeProcessor()

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: Any) -> np.ndarray:
        self.served.append(int(batch["state"][0]))
        if self.compute_s:
            time.sleep(self.compute_s)
        return self._chunk.copy()

    def reset(self) -> None:
        self.resets += 1


class BatchingFixedPolicy(FixedComputePolicy):
    """A `BatchingPolicy` whose forward of ``b`` samples takes ``compute_ms + per_sample_ms * b``.

    Raises for the whole batch when a sample's state is negative (like `FailingPolicy` alone).
    ``batches`` records every batched forward as ``(states, delays, prefix lengths)``; worker
    thread writes, tests read after the server drained.
    """

    def __init__(self, compute_ms: float = 0.0, per_sample_ms: float = 0.0, **spec: Any) -> None:
        super().__init__(compute_ms, **spec)
        self.per_sample_s = per_sample_ms / 1e3
        self.batches: list[tuple[list[int], list[int], list[int | None]]] = []

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: Any) -> np.ndarray:
        if batch["state"][0] < 0:
            raise RuntimeError("policy bug on negative input")
        return super().predict_chunk(batch, inference_delay, prefix)

    def predict_chunk_batch(
        self, batches: Sequence[Any], inference_delays: Sequence[int], prefixes: Sequence[np.ndarray | None]
    ) -> np.ndarray:
        states = [int(b["state"][0]) for b in batches]
        self.batches.append((states, list(inference_delays), [None if p is None else len(p) for p in prefixes]))
        if any(s < 0 for s in states):
            raise RuntimeError("policy bug on negative input")
        self.served.extend(states)
        if self.compute_s or self.per_sample_s:
            time.sleep(self.compute_s + self.per_sample_s * len(batches))
        return np.stack([self._chunk] * len(batches))


class GatedPolicy(FixedComputePolicy):
    """``predict_chunk`` sets ``entered`` and blocks until ``gate`` opens (cross-thread Events).

    The gate is open during warm-up (``armed`` is False until a test arms it); an armed forward
    that finds the gate already open passes without setting ``entered``.
    """

    def __init__(self, **spec: Any) -> None:
        super().__init__(**spec)
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.armed = False

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: Any) -> np.ndarray:
        if self.armed and not self.gate.is_set():
            self.entered.set()
            if not self.gate.wait(10):
                raise TimeoutError("gate never opened")
        return super().predict_chunk(batch, inference_delay, prefix)


class GatedBatchingPolicy(GatedPolicy, BatchingFixedPolicy):
    """`BatchingFixedPolicy` whose single forwards block at `GatedPolicy`'s gate once ``armed``.

    A test holds the device with one session's forward while others' observations queue up.
    """


class StickyProcessor:
    """Deliberately holds state across requests: the episode's first state and a request count.

    ``postprocess`` returns ``anchor + count`` in every cell, so a chunk tells which session's
    history produced it. Shared between sessions it would mix two robots' anchors and counts.
    """

    def __init__(self) -> None:
        self.anchor: np.ndarray | None = None
        self.count = 0

    def preprocess(self, obs: DecodedObservation) -> Prepared:
        if self.anchor is None:
            self.anchor = np.array(obs.state, dtype=np.float32)
        self.count += 1
        return Prepared(batch=None, prefix=None)

    def postprocess(self, chunk: np.ndarray) -> np.ndarray:
        assert self.anchor is not None
        return chunk + self.anchor + np.float32(self.count)

    def reset(self) -> None:
        self.anchor = None
        self.count = 0


class StickyPolicy(FixedComputePolicy):
    """A chunk-stateless policy whose per-session processor is a `StickyProcessor`."""

    def make_processor(self) -> StickyProcessor:  # type: ignore[override]
        return StickyProcessor()

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: Any) -> np.ndarray:
        if self.compute_s:
            time.sleep(self.compute_s)
        return np.zeros_like(self._chunk)


class WarmupGatedPolicy(FixedComputePolicy):
    """Warm-up blocks until ``release`` is set; ``warming`` is set when it starts."""

    def __init__(self, **spec: Any) -> None:
        super().__init__(**spec)
        self.warming = threading.Event()
        self.release = threading.Event()

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: Any) -> np.ndarray:
        if not self.release.is_set():
            self.warming.set()
            if not self.release.wait(10):
                raise TimeoutError("warm-up never released")
        return super().predict_chunk(batch, inference_delay, prefix)


class FailingPolicy(FixedComputePolicy):
    """Raises for states whose first value is negative, serves the others."""

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: Any) -> np.ndarray:
        if batch["state"][0] < 0:
            raise RuntimeError("policy bug on negative input")
        return super().predict_chunk(batch, inference_delay, prefix)


class CostCyclePolicy(FixedComputePolicy):
    """Forward ``i`` takes ``costs_ms[i % len(costs_ms)]`` (a sleep): a policy of known, uneven cost."""

    def __init__(self, costs_ms: list[float], **spec: Any) -> None:
        super().__init__(**spec)
        self._costs_s = [cost / 1e3 for cost in costs_ms]
        self._forwards = 0

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: Any) -> np.ndarray:
        time.sleep(self._costs_s[self._forwards % len(self._costs_s)])
        self._forwards += 1
        return super().predict_chunk(batch, inference_delay, prefix)


# Factories for manifests (``source = "tests.server.policies:make_…"``): a policy process builds its own.


def make_failing(**_: Any) -> FailingPolicy:
    """`FailingPolicy` without cameras."""
    return FailingPolicy(cameras={})


def make_sticky(compute_ms: float = 0.0, **_: Any) -> StickyPolicy:
    """`StickyPolicy` with the default spec (one 24x32 camera)."""
    return StickyPolicy(compute_ms=compute_ms)


def make_batching(compute_ms: float = 0.0, **_: Any) -> BatchingFixedPolicy:
    """`BatchingFixedPolicy` without cameras."""
    return BatchingFixedPolicy(compute_ms=compute_ms, cameras={})
