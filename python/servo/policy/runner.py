"""Runs a policy for one request: preprocess, predict, validate, postprocess.

Shared by the server's inference worker and the edge's local engines, so both paths produce
identical chunks for identical inputs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Literal, Protocol

import numpy as np

from servo.logs import LogThrottle, get_logger
from servo.policy.errors import PolicyLoadError, PolicyOutputError
from servo.policy.protocol import (
    BatchingPolicy,
    DecodedObservation,
    FloatArray,
    Policy,
    PolicySpec,
    Prepared,
    Processor,
)

log = get_logger(__name__)
#: A failing batched forward is logged once per second at most, with the count held back.
_THROTTLE = LogThrottle(1.0)

DType = Literal["float32", "bfloat16", "float16"]
#: One request of a batch: the session's processor, its observation, its inference delay.
Request = tuple[Processor, DecodedObservation, int]
#: The (model-space, robot-space) chunks of one request, or what made it fail.
Outcome = tuple[FloatArray, FloatArray] | Exception


class Forwards(Protocol):
    """What serves a server's forwards: an `InferenceRunner` in its process, or its policy process.

    Owned by the inference worker's thread, except `spec`, `batching` and `make_processor`.
    """

    @property
    def spec(self) -> PolicySpec:
        """The policy's spec."""
        ...

    @property
    def batching(self) -> bool:
        """Whether the policy predicts several sessions' chunks in one forward (`BatchingPolicy`)."""
        ...

    def make_processor(self) -> Processor:
        """A new session's processor."""
        ...

    def reset_policy(self) -> None:
        """Forget the policy's episode state (exclusive serving)."""
        ...

    def infer_batch(self, requests: Sequence[Request]) -> list[Outcome]:
        """Serve ``requests`` (see `InferenceRunner.infer_batch`)."""
        ...

    def warmup(self, count: int, batch_sizes: Sequence[int] = ()) -> list[float]:
        """Warm up (see `InferenceRunner.warmup`)."""
        ...

    def timed_forwards(self, count: int) -> list[float]:
        """Time forwards (see `InferenceRunner.timed_forwards`)."""
        ...


class InferenceRunner:
    """Owns a policy and the torch settings it runs under.

    Owned by exactly one thread (the server's inference worker or a local engine's thread);
    torch modules are not thread-safe.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        device: str = "cpu",
        dtype: DType = "float32",
        compile: bool = False,
        cuda_graphs: bool = False,
    ) -> None:
        import torch

        self.policy = policy
        self.device = device
        self.dtype = dtype
        self._graphs = cuda_graphs
        if device.startswith("cuda"):
            # Kernel selection once at warm-up, TF32 matmuls: the inference settings of docs/design/serving.md §6.
            torch.backends.cudnn.benchmark = True
            torch.set_float32_matmul_precision("high")
        # Both happen lazily on the first forwards (of each input shape), i.e. during warm-up.
        if compile:
            _policy_option(policy, "compile", "compile", "to apply torch.compile")
        if cuda_graphs:
            _policy_option(policy, "cuda_graphs", "use_cuda_graphs", "to capture graphs with")
        spec = policy.spec
        self._expected = (spec.chunk_size, len(spec.features.action_names))

    @property
    def spec(self) -> PolicySpec:
        """The policy's spec."""
        return self.policy.spec

    @property
    def batching(self) -> bool:
        """Whether the policy is a `BatchingPolicy`."""
        return isinstance(self.policy, BatchingPolicy)

    def make_processor(self) -> Processor:
        """A new session's processor."""
        return self.policy.make_processor()

    def reset_policy(self) -> None:
        """Forget the policy's episode state."""
        self.policy.reset()

    @contextlib.contextmanager
    def _torch_mode(self) -> Iterator[None]:
        import torch

        with torch.inference_mode():
            if self.dtype != "float32" and self.device.startswith("cuda"):
                # Autocast's weight cache and CUDA graph capture do not mix (PyTorch's graph docs).
                with torch.autocast("cuda", dtype=getattr(torch, self.dtype), cache_enabled=not self._graphs):
                    yield
            else:
                yield

    def infer(
        self, processor: Processor, obs: DecodedObservation, inference_delay: int
    ) -> tuple[FloatArray, FloatArray]:
        """One request: returns the (model-space, robot-space) chunks.

        ``inference_delay`` is clamped to [0, chunk_size] here, so every caller (server worker,
        local engines) hands the policy the same value for the same request.

        Raises:
            PolicyOutputError: the chunk has the wrong shape or non-finite values.
        """
        delay = clamp_delay(inference_delay, self._expected[0])
        with self._torch_mode():
            prepared = processor.preprocess(obs)
            chunk = self.policy.predict_chunk(prepared.batch, delay, prepared.prefix)
            return self._finish(processor, chunk)

    def infer_batch(self, requests: Sequence[Request]) -> list[Outcome]:
        """Several sessions' requests in one forward (`BatchingPolicy.predict_chunk_batch`).

        Each request succeeds or fails on its own: a request whose preprocessing, chunk or
        postprocessing fails gets its exception in its place, the others their chunks. When the
        batched forward itself raises or returns the wrong shape, every request is predicted
        alone, so one bad input cannot fail the others. A policy without ``predict_chunk_batch``
        is run one request at a time.
        """
        if len(requests) == 1 or not isinstance(self.policy, BatchingPolicy):
            return [self._infer_one(*request) for request in requests]
        outcomes: list[Outcome | None] = [None] * len(requests)
        with self._torch_mode():
            prepared: list[tuple[int, Prepared, int]] = []
            for i, (processor, obs, delay) in enumerate(requests):
                try:
                    prepared.append((i, processor.preprocess(obs), clamp_delay(delay, self._expected[0])))
                except Exception as exc:
                    outcomes[i] = exc
            chunks = self._predict_batch(prepared)
            for (i, prep, delay), chunk in zip(prepared, chunks, strict=True):
                try:
                    if chunk is None:
                        chunk = self.policy.predict_chunk(prep.batch, delay, prep.prefix)
                    outcomes[i] = self._finish(requests[i][0], chunk)
                except Exception as exc:
                    outcomes[i] = exc
        return [outcome for outcome in outcomes if outcome is not None]

    def _infer_one(self, processor: Processor, obs: DecodedObservation, delay: int) -> Outcome:
        try:
            return self.infer(processor, obs, delay)
        except Exception as exc:
            return exc

    def _predict_batch(self, prepared: Sequence[tuple[int, Prepared, int]]) -> list[FloatArray | None]:
        """The batched forward's chunks; all None (predict alone) when it fails as a whole."""
        assert isinstance(self.policy, BatchingPolicy)
        if len(prepared) < 2:
            return [None] * len(prepared)
        try:
            out = self.policy.predict_chunk_batch(
                [p.batch for _, p, _ in prepared], [d for _, _, d in prepared], [p.prefix for _, p, _ in prepared]
            )
            chunks = np.asarray(out, dtype=np.float32)
            if chunks.shape != (len(prepared), *self._expected):
                raise PolicyOutputError(f"batched chunks have shape {chunks.shape}, expected {self._expected} each")
        except Exception as exc:
            if (suppressed := _THROTTLE.allow(type(exc).__name__)) is not None:
                log.warning(
                    "batched forward failed: predicting each sample alone",
                    batch=len(prepared),
                    error=f"{type(exc).__name__}: {exc}",
                    suppressed=suppressed,
                )
            return [None] * len(prepared)
        return list(chunks)

    def _finish(self, processor: Processor, chunk: FloatArray) -> tuple[FloatArray, FloatArray]:
        model = self._checked(np.asarray(chunk, dtype=np.float32), "policy chunk")
        return model, self._checked(np.asarray(processor.postprocess(model), dtype=np.float32), "postprocessed chunk")

    def warmup(self, count: int, batch_sizes: Sequence[int] = ()) -> list[float]:
        """Run ``count`` forwards, then one batched forward of each size in ``batch_sizes``.

        The forwards run on a synthetic observation built from the policy's spec; the batched
        ones only for a `BatchingPolicy`. Kernel choice (cudnn benchmark), compilation and CUDA
        graphs happen per input shape, so every batch size served is warmed before the first
        client pays for it.

        Returns:
            Each request's duration (s, monotonic clock): preprocessing, forward and
            postprocessing, the chunk copied back to the host.

        Raises:
            PolicyLoadError: a forward failed or produced an unusable chunk (one line).
        """
        durations = self.timed_forwards(count, "warm-up")
        if count == 0 or not isinstance(self.policy, BatchingPolicy):
            return durations
        for size in batch_sizes:
            if size < 2:
                continue
            requests = [(self.policy.make_processor(), synthetic_observation(self.policy), 0) for _ in range(size)]
            failed = [o for o in self.infer_batch(requests) if isinstance(o, Exception)]
            if failed:
                raise PolicyLoadError(
                    f"warm-up forward of a batch of {size} failed: {type(failed[0]).__name__}: {failed[0]}"
                )
        return durations

    def timed_forwards(self, count: int, what: str = "timed") -> list[float]:
        """Run ``count`` requests on a synthetic observation, one processor; each one's duration (s).

        A request is what a served one costs the worker: preprocessing, forward, postprocessing
        and the chunk back on the host (`warmup`; the capacity plan's timing after it).

        Raises:
            PolicyLoadError: a forward failed or produced an unusable chunk (one line).
        """
        processor = self.policy.make_processor()
        durations = []
        for i in range(count):
            try:
                started = time.perf_counter()
                self.infer(processor, synthetic_observation(self.policy), 0)
                durations.append(time.perf_counter() - started)
            except PolicyOutputError as exc:
                raise PolicyLoadError(f"{what} forward {i + 1} of {count}: {exc}") from exc
            except Exception as exc:
                raise PolicyLoadError(f"{what} forward {i + 1} of {count} failed: {type(exc).__name__}: {exc}") from exc
        return durations

    def _checked(self, chunk: FloatArray, what: str) -> FloatArray:
        if chunk.shape != self._expected:
            raise PolicyOutputError(f"{what} has shape {chunk.shape}, expected {self._expected}")
        if not np.isfinite(chunk).all():
            raise PolicyOutputError(f"{what} contains NaN or inf")
        return np.ascontiguousarray(chunk)


def _policy_option(policy: Policy, key: str, method: str, purpose: str) -> None:
    """Call the policy's ``method()`` that manifest option ``model.<key>`` asks for, or refuse in one line."""
    fn = getattr(policy, method, None)
    if fn is None:
        raise PolicyLoadError(f"model.{key}: {policy.spec.model} has no {method}() method {purpose}")
    fn()


def clamp_delay(steps: int, chunk_size: int) -> int:
    """The inference delay a policy is given: steps already executed, within [0, chunk_size]."""
    return max(0, min(int(steps), chunk_size))


def synthetic_observation(policy: Policy) -> DecodedObservation:
    """A zero observation with the policy's feature shapes (warm-up, smoke tests)."""
    features = policy.spec.features
    return DecodedObservation(
        state=np.zeros(len(features.state_names), dtype=np.float32),
        images={name: np.zeros((cam.height, cam.width, 3), dtype=np.uint8) for name, cam in features.cameras.items()},
    )
