"""The edge's per-request statistics are bounded: merging chunks does not grow the Python heap.

A fast counterpart of the RSS soak (tests/test_soak.py): tracemalloc sees even one float kept
per request (8 bytes x 2·10⁴ = 160 kB), which RSS cannot resolve.
"""

from __future__ import annotations

import gc
import time
import tracemalloc

import numpy as np

from servo.edge.config import EdgeConfig
from servo.edge.engine import LOCAL_SESSION
from servo.edge.observation import ObservationInput
from servo.edge.pipeline import PipelineConfig, Produced
from servo.robots import SimConfig, SimSO100
from tests.edge.fakes import EchoEngine

MERGES = 20_000
#: Python heap growth allowed over MERGES merges (allocator noise; one float kept per merge would be 160 kB).
ALLOWED_BYTES = 64 * 1024


def test_merges_keep_the_python_heap_flat() -> None:
    spec = SimSO100(SimConfig(cameras=())).spec
    engine = EchoEngine(EdgeConfig(pipeline=PipelineConfig(rtc=False)), spec)
    state = np.zeros(spec.action_dim, np.float32)
    chunk = state[None, :]

    def one(seq: int) -> None:
        now = time.monotonic_ns()
        position = engine.pipeline.queue.get_position()
        request = engine.pipeline.snapshot(ObservationInput(state, {}, now - 1_000_000, seq, position))
        engine.merge(request, Produced(chunk, chunk, LOCAL_SESSION, seq, 0.0), now)
        engine.get_action(now)

    for seq in range(1_000):  # warm caches and allocator pools
        one(seq)
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for seq in range(MERGES):
            one(seq)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert engine.chunks_received == 1_000 + MERGES
    assert engine.rtt.count() == engine.rtt.window
    grown = after - before
    assert grown < ALLOWED_BYTES, f"the Python heap grew by {grown} bytes over {MERGES} merges"
