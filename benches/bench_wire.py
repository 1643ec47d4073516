"""Observation encode+decode: servo's wire format vs pickling the raw arrays (the legacy
prototype's approach), and how much of servo's cost is JPEG.

Payload: two 480x640 RGB frames (rendered by the sim, so JPEG sizes are camera-like) + a 6-d
state. Smoke: ``pytest benches/bench_wire.py --benchmark-disable``; measure with
``--benchmark-enable --benchmark-only``. ``extra_info`` records the payload size and whether the
round trip is exact (raw, pickle) or within JPEG tolerance.
"""

from __future__ import annotations

import pickle  # the baseline only: servo never unpickles anything
from collections.abc import Callable

import numpy as np
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from servo.robots import SimCameras, SimConfig, SimSO100
from servo.wire import Observation, decode, decode_image, decode_tensor, encode, encode_image, encode_tensor

Arrays = dict[str, np.ndarray]


def _payload() -> Arrays:
    sim = SimSO100(SimConfig())
    cameras = SimCameras(sim.config, sim)
    sim.connect()
    cameras.connect()
    try:
        frames = cameras.wait_for_frames(5.0)
        return {"state": sim.read_state(), **{name: np.array(f) for name, f in frames.items()}}
    finally:
        cameras.disconnect()
        sim.disconnect()


PAYLOAD = _payload()
CAMERAS = [k for k in PAYLOAD if k != "state"]


def servo_round_trip(quality: int) -> Callable[[], tuple[int, Arrays]]:
    def run() -> tuple[int, Arrays]:
        body = encode(
            Observation(
                state=encode_tensor(PAYLOAD["state"]),
                images={name: encode_image(PAYLOAD[name], quality) for name in CAMERAS},
            )
        )
        obs = decode(body, Observation)
        out = {"state": decode_tensor(obs.state), **{n: decode_image(obs.images[n]) for n in CAMERAS}}
        return len(body), out

    return run


def pickle_round_trip() -> tuple[int, Arrays]:
    body = pickle.dumps(PAYLOAD, protocol=pickle.HIGHEST_PROTOCOL)
    return len(body), pickle.loads(body)


def jpeg_only() -> tuple[int, Arrays]:
    encoded = {name: encode_image(PAYLOAD[name], 90) for name in CAMERAS}
    return sum(len(e.data) for e in encoded.values()), {n: decode_image(e) for n, e in encoded.items()}


CASES: dict[str, Callable[[], tuple[int, Arrays]]] = {
    "servo-raw": servo_round_trip(0),
    "servo-jpeg90": servo_round_trip(90),
    "pickle-raw (baseline)": pickle_round_trip,
    "jpeg90 codec alone": jpeg_only,
}


@pytest.mark.benchmark(group="observation-encode+decode")
@pytest.mark.parametrize("case", list(CASES))
def test_observation_round_trip(benchmark: BenchmarkFixture, case: str) -> None:
    size, out = benchmark(CASES[case])
    exact = all(np.array_equal(out[k], PAYLOAD[k]) for k in out)
    close = all(np.abs(out[k].astype(int) - PAYLOAD[k].astype(int)).mean() < 3 for k in out)
    benchmark.extra_info["bytes"] = size
    benchmark.extra_info["exact"] = exact
    benchmark.extra_info["correct"] = exact if "jpeg" not in case else close
    assert benchmark.extra_info["correct"]
