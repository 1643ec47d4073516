"""Observation encode+decode: servo's wire format vs pickling the raw arrays (the legacy
prototype's approach), how much of servo's cost is JPEG, and what the session cipher adds to a
request (group ``request-cipher``).

Payload: two 480x640 RGB frames (rendered by the sim, so JPEG sizes are camera-like) + a 6-d
state. Smoke: ``pytest benches/bench_wire.py --benchmark-disable``; measure with
``--benchmark-enable --benchmark-only``. ``extra_info`` records the payload size and whether the
round trip is exact (raw, pickle) or within JPEG tolerance.
"""

from __future__ import annotations

import itertools
import pickle  # the baseline only: servo never unpickles anything
from collections.abc import Callable

import numpy as np
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from servo._core import MSG_CHUNK, MSG_OBS, SCHEMA_VERSION, Header, SessionKey
from servo.robots import SimCameras, SimConfig, SimSO100
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


# ----------------------------------------------------------------------------- session cipher in a request
# What protection adds to one request: the client encrypts its observation, the server decrypts
# it, the server encrypts the chunk, the client decrypts it. Baseline: the same request's codec
# work without any protection (encode + decode of the observation and of a 50x6 chunk), in the
# same run. (bench_cipher.py puts the cipher beside the MAC of wire schema 2.)
SECRET = bytes(range(32))
REQUEST = Header(SCHEMA_VERSION, MSG_OBS, 0, 7, 0, 1, 123, bytes(range(16)))
CHUNK = np.random.default_rng(0).standard_normal((50, 6)).astype(np.float32)


def request_codec(quality: int, *, cipher: bool) -> Callable[[], bool]:
    images = {name: encode_image(PAYLOAD[name], quality) for name in CAMERAS}
    client, server = SessionKey(SECRET, role="client"), SessionKey(SECRET, role="server")
    seqs = itertools.count(1)

    def run() -> bool:
        body = encode(Observation(state=encode_tensor(PAYLOAD["state"]), images=images))
        ok = True
        request = REQUEST.replace(seq_id=next(seqs))
        if cipher:
            header, body = server.decrypt(*client.encrypt(request, body))
            ok = header == request
        obs = decode(body, Observation)
        chunk = encode(ActionChunk(encode_tensor(CHUNK), 1.0, 2.0))
        if cipher:
            reply = request.replace(msg_type=MSG_CHUNK)
            header, chunk = client.decrypt(*server.encrypt(reply, chunk))
            ok = ok and header == reply
        answer = decode(chunk, ActionChunk)
        return ok and len(obs.images) == len(CAMERAS) and answer.chunk_robot.shape == (50, 6)

    return run


CIPHER_CASES = {
    f"{name}{' + AES-256-GCM' if cipher else ''}": request_codec(quality, cipher=cipher)
    for name, quality in (("raw", 0), ("jpeg90", 90))
    for cipher in (False, True)
}


@pytest.mark.benchmark(group="request-cipher")
@pytest.mark.parametrize("case", list(CIPHER_CASES))
def test_cipher_per_request(benchmark: BenchmarkFixture, case: str) -> None:
    """The four cipher passes of one request (encrypt + decrypt, both ways), against the request's codec alone.

    JPEG images are encoded once outside the timing: the JPEG codec is measured above and does
    not change with the cipher.
    """
    ok = benchmark(CIPHER_CASES[case])
    benchmark.extra_info["correct"] = bool(ok)
    assert ok
