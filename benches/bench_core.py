"""Benchmarks of servo._core against same-run pure-Python baselines.

Smoke test: ``pytest benches/bench_core.py --benchmark-disable``.
Measure: ``pytest benches/bench_core.py --benchmark-enable --benchmark-only``
(add ``--benchmark-json=benches/results/raw/core.json`` to keep the numbers).

Targets (reported, not asserted): ``ActionQueue.get`` median <= 1 us and >= 5x faster than the
reference queue; ``ActionQueue.merge`` of a 50x32 chunk <= 10 us. The session cipher is measured
beside the MAC it replaced in bench_cipher.py.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from servo import _core
from servo._core import ActionQueue, Header, decode_header, unauthenticated

if _core.build_profile != "release":
    pytest.skip(
        f"servo._core is a {_core.build_profile} build; benchmarks only measure release builds "
        "(run `maturin develop --release`)",
        allow_module_level=True,
    )

ACTION_DIM = 32
CHUNK = 50


class ReferenceQueue:
    """LeRobot-style ActionQueue in pure Python (threading.Lock + numpy), same semantics."""

    def __init__(self, action_dim: int, *, rtc: bool, capacity: int = 4096) -> None:
        self.action_dim = action_dim
        self.rtc = rtc
        self.capacity = capacity
        self.lock = threading.Lock()
        self.original: np.ndarray | None = None
        self.processed: np.ndarray | None = None
        self.last_index = 0

    def get(self) -> np.ndarray | None:
        with self.lock:
            if self.processed is None or self.last_index >= len(self.processed):
                return None
            action: np.ndarray = self.processed[self.last_index].copy()
            self.last_index += 1
            return action

    def qsize(self) -> int:
        with self.lock:
            return 0 if self.processed is None else len(self.processed) - self.last_index

    def merge(
        self,
        original: np.ndarray,
        processed: np.ndarray,
        real_delay: int,
        idx_before: int | None = None,
    ) -> int:
        for name, chunk in (("original", original), ("processed", processed)):
            if chunk.dtype != np.float32:
                raise ValueError(f"{name} has dtype {chunk.dtype}, expected float32")
            if chunk.ndim != 2 or chunk.shape[1] != self.action_dim or len(chunk) == 0:
                raise ValueError(f"{name} has shape {chunk.shape}, expected (T, {self.action_dim})")
        if len(original) != len(processed):
            raise ValueError("original and processed differ in T")
        with self.lock:
            delay = max(0, real_delay)
            if idx_before is not None:
                delay = min(delay, max(0, self.last_index - idx_before))
            if self.rtc:
                if len(original) > self.capacity:
                    raise ValueError("chunk exceeds capacity")
                delay = min(delay, len(original))
                self.original = original[delay:].copy()
                self.processed = processed[delay:].copy()
                self.last_index = 0
                return delay
            kept = 0 if self.processed is None else len(self.processed) - self.last_index
            if kept + len(original) > self.capacity:
                raise ValueError("merge exceeds capacity")
            if self.original is None or self.processed is None:
                self.original, self.processed = original.copy(), processed.copy()
            else:
                start = self.last_index
                self.original = np.concatenate([self.original[start:], original])
                self.processed = np.concatenate([self.processed[start:], processed])
            self.last_index = 0
            return 0


def make_queue(impl: str, *, rtc: bool, capacity: int = 4096) -> Any:
    if impl == "servo":
        return ActionQueue(ACTION_DIM, rtc=rtc, capacity=capacity)
    return ReferenceQueue(ACTION_DIM, rtc=rtc, capacity=capacity)


def tagged_chunk(t: int) -> np.ndarray:
    """Row i is filled with i, so any returned action names the row it came from."""
    rows = np.arange(t, dtype=np.float32)[:, None]
    return np.ascontiguousarray(np.repeat(rows, ACTION_DIM, axis=1))


IMPLS = ["servo", "python-reference"]


GET_ROUNDS, GET_ITERATIONS, GET_WARMUP = 1_000, 100, 10


@pytest.mark.benchmark(group="queue-get")
@pytest.mark.parametrize("impl", IMPLS)
def test_queue_get(benchmark: Any, impl: str) -> None:
    # One queue big enough for every call of the run, so `get` never hits empty and the
    # timed loop calls the bound method directly (no wrapper, no refill in the timings).
    big = tagged_chunk((GET_ROUNDS + GET_WARMUP + 10) * GET_ITERATIONS)
    q = make_queue(impl, rtc=True, capacity=len(big))
    q.merge(big, big, 0)
    first = [q.get() for _ in range(3)]
    correct = all(a is not None and np.array_equal(a, big[i]) for i, a in enumerate(first))
    action = benchmark.pedantic(q.get, rounds=GET_ROUNDS, iterations=GET_ITERATIONS, warmup_rounds=GET_WARMUP)
    correct = correct and action is not None and action.shape == (ACTION_DIM,)
    correct = correct and action.dtype == np.float32 and bool(np.all(action == action[0]))
    benchmark.extra_info["correct"] = bool(correct)
    assert correct


@pytest.mark.benchmark(group="queue-merge")
@pytest.mark.parametrize("impl", IMPLS)
def test_queue_merge(benchmark: Any, impl: str) -> None:
    rng = np.random.default_rng(0)
    original = rng.standard_normal((CHUNK, ACTION_DIM)).astype(np.float32)
    processed = rng.standard_normal((CHUNK, ACTION_DIM)).astype(np.float32)
    q = make_queue(impl, rtc=True)
    q.merge(original, processed, 0)
    for _ in range(5):
        q.get()

    trimmed = benchmark(q.merge, original, processed, 3)
    action = q.get()
    correct = trimmed == 3 and q.qsize() == CHUNK - 4
    correct = correct and action is not None and np.array_equal(action, processed[3])
    benchmark.extra_info["correct"] = bool(correct)
    assert correct


HEADER_FIELDS = (_core.SCHEMA_VERSION, _core.MSG_CHUNK, 0, 123_456_789_012, 42, 7, 987_654_321_000, bytes(range(16)))
LAYOUT = struct.Struct("<2sHBBQIIq16s16s")  # header || zero tag


def servo_round_trip() -> Any:
    return decode_header(unauthenticated(SERVO_HEADER))


def struct_round_trip() -> Any:
    return LAYOUT.unpack(LAYOUT.pack(b"SV", *HEADER_FIELDS, bytes(16)))


SERVO_HEADER = Header(*HEADER_FIELDS)
ROUND_TRIPS: dict[str, Callable[[], Any]] = {
    "servo": servo_round_trip,
    "struct": struct_round_trip,
}


@pytest.mark.benchmark(group="header")
@pytest.mark.parametrize("impl", list(ROUND_TRIPS))
def test_header_encode_decode(benchmark: Any, impl: str) -> None:
    result = benchmark(ROUND_TRIPS[impl])
    expected = SERVO_HEADER if impl == "servo" else (b"SV", *HEADER_FIELDS, bytes(16))
    correct = result == expected
    if impl == "servo":
        correct = correct and unauthenticated(SERVO_HEADER) == LAYOUT.pack(b"SV", *HEADER_FIELDS, bytes(16))
    benchmark.extra_info["correct"] = bool(correct)
    assert correct
