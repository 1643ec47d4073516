"""The adapter contract every policy implements (server side and local engines alike).

A policy instance is shared by every session of a server, so anything that holds per-client
state lives in a `Processor`, of which each session gets its own. ``predict_chunk`` of a
chunk-stateless policy touches no instance state; a chunk-stateful one is served in exclusive
mode (one session, ``reset`` at every episode boundary).

A chunk-stateless policy may also implement `BatchingPolicy.predict_chunk_batch`: the server then
serves several sessions' observations in one forward when their shapes stack and no client's
deadline is put at risk (`servo.server.scheduler.DeadlineBatcher`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from servo.wire import Features, Tuning

FloatArray = npt.NDArray[np.float32]
Frame = npt.NDArray[np.uint8]


@dataclass(frozen=True)
class PolicySpec:
    """Static description of a policy.

    Attributes:
        model: Model id (free text, e.g. ``lerobot/act_so100``).
        revision: Checkpoint revision or hash.
        features: Camera names/shapes, state names, ordered action names.
        chunk_size: Actions per predicted chunk.
        fps: Control rate the policy was trained at.
        supports_rtc: ``predict_chunk`` honours ``inference_delay`` and ``prefix``.
        chunk_stateless: ``predict_chunk`` reads and writes no instance state.
        device_frames: Its processors also take frames as torch tensors already on the policy's
            device (`servo.policy.frames.stack_on_device` handles both), so a server on CUDA may
            decode JPEG onto the GPU (``model.frames = "auto"``).
        tuning: Its options that lengthen a chunk or shorten a forward, named in every "too
            slow for its chunks" advice.
    """

    model: str
    revision: str
    features: Features
    chunk_size: int
    fps: float
    supports_rtc: bool
    chunk_stateless: bool
    device_frames: bool = False
    tuning: Tuning = field(default_factory=Tuning)


@dataclass
class DecodedObservation:
    """An observation as policies see it: numpy arrays in robot space.

    Frames are ``(H, W, 3)`` uint8 numpy arrays; for a policy whose spec declares
    ``device_frames``, served with ``model.frames`` on the device, they are torch uint8 tensors
    of that shape already on the policy's device instead (typed as arrays for every other
    policy's sake; `servo.policy.frames.stack_on_device` takes either).

    ``prefix_model`` / ``prefix_robot`` are the unexecuted rest of the client's current chunk,
    in model and robot space (``None`` when the client runs without RTC or has nothing queued).

    The arrays are **read-only**: raw frames, the state and the prefixes are views into the
    received message (no copy on the serving path). A processor that needs to write, or hands an
    array to ``torch.from_numpy`` (which warns on read-only memory), copies it first —
    ``torch.as_tensor(np.array(frame))`` or ``torch.tensor(frame)``. JPEG frames are decoded into
    fresh arrays but are marked read-only too, so a policy behaves the same for both codecs.
    """

    state: FloatArray
    images: dict[str, Frame]
    task: str = ""
    prefix_model: FloatArray | None = None
    prefix_robot: FloatArray | None = None
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass
class Prepared:
    """A preprocessed observation: the model input and the RTC prefix in model space."""

    batch: Any
    prefix: FloatArray | None


@runtime_checkable
class Processor(Protocol):
    """Per-session pre/post-processing; may cache state between the two halves of a request.

    Owned by whichever thread runs inference (the server's inference worker or a local engine's
    thread); never shared between sessions.
    """

    def preprocess(self, obs: DecodedObservation) -> Prepared:
        """Turn a robot-space observation into model input (and a model-space RTC prefix)."""
        ...

    def postprocess(self, chunk: FloatArray) -> FloatArray:
        """Turn a model-space chunk (T, A) into robot-space targets (T, A)."""
        ...

    def reset(self) -> None:
        """Forget everything cached (episode boundary)."""
        ...


@runtime_checkable
class Policy(Protocol):
    """A chunking policy, loaded once and warmed before it serves.

    Owned by the inference thread; only `spec` is read from other threads.
    """

    @property
    def spec(self) -> PolicySpec:
        """Static description (features, chunk size, fps, RTC support, statelessness)."""
        ...

    def make_processor(self) -> Processor:
        """A fresh per-session processor."""
        ...

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: FloatArray | None) -> FloatArray:
        """Predict one model-space chunk of shape (chunk_size, action_dim).

        Args:
            batch: Output of `Processor.preprocess`.
            inference_delay: Steps that will have executed before the chunk arrives (RTC).
            prefix: Model-space actions still queued on the robot, to continue smoothly (RTC).
        """
        ...

    def reset(self) -> None:
        """Forget episode state (only chunk-stateful policies have any)."""
        ...


@runtime_checkable
class BatchingPolicy(Policy, Protocol):
    """A chunk-stateless policy that predicts several sessions' chunks in one forward.

    Owned by the inference thread, like any `Policy`.
    """

    def predict_chunk_batch(
        self,
        batches: Sequence[Any],
        inference_delays: Sequence[int],
        prefixes: Sequence[FloatArray | None],
    ) -> FloatArray:
        """Predict one model-space chunk per sample: shape (len(batches), chunk_size, action_dim).

        Sample ``i`` must get the chunk ``predict_chunk(batches[i], inference_delays[i],
        prefixes[i])`` would give. The server only batches observations whose state and camera
        shapes are equal; tasks, delays and prefixes (of any length, or None) vary per sample.

        Args:
            batches: Outputs of `Processor.preprocess`, one per session.
            inference_delays: Per-sample steps executed before the chunk arrives (RTC).
            prefixes: Per-sample model-space actions still queued on the robot (RTC).
        """
        ...
