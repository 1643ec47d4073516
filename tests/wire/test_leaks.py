"""Hot-path codecs do not leak: 10^4 encode/decode rounds keep RSS bounded."""

from __future__ import annotations

import gc
import os

import numpy as np

from servo.wire import (
    ActionChunk,
    Observation,
    decode,
    decode_image,
    decode_tensor,
    encode,
    encode_image,
    encode_tensor,
)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def round_trip(frame: np.ndarray, state: np.ndarray, chunk: np.ndarray) -> None:
    obs = decode(
        encode(Observation(state=encode_tensor(state), images={"front": encode_image(frame, 80)})), Observation
    )
    decode_image(obs.images["front"])
    decode_tensor(obs.state)
    reply = decode(encode(ActionChunk(encode_tensor(chunk), 1.0, 2.0, chunk_model=encode_tensor(chunk))), ActionChunk)
    decode_tensor(reply.chunk_robot)


def test_codec_round_trips_do_not_leak() -> None:
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
    state = rng.standard_normal(6).astype(np.float32)
    chunk = rng.standard_normal((50, 6)).astype(np.float32)
    for _ in range(500):  # warm allocator pools and caches first
        round_trip(frame, state, chunk)
    gc.collect()
    before = rss_bytes()
    for _ in range(10_000):
        round_trip(frame, state, chunk)
    gc.collect()
    grown = rss_bytes() - before
    # Each round allocates ~20 kB; a leak of even one buffer per round would be ~200 MB.
    assert grown < 8 * 1024 * 1024, f"RSS grew by {grown / 1e6:.1f} MB over 10^4 rounds"
