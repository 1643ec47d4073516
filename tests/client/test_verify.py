"""The client's verifiers on their own: chunk checks, server pins, session-ack verification."""

from __future__ import annotations

import logging

import msgspec
import numpy as np
import pytest

from servo._core import SCHEMA_VERSION, KeyPair, ServerIdentity
from servo.client import RequestTimeout, RogueServer, SessionRejected, TrustedServers
from servo.client.trust import pick_ack
from servo.client.verify import REJECT_REASONS, ChunkRejected, ClientCounters, check_chunk
from servo.logs import LogThrottle
from servo.wire import (
    ActionChunk,
    CameraFeature,
    Features,
    PolicyInfo,
    Rejection,
    ServerKeys,
    SessionAck,
    StatusReply,
    Tensor,
    WireError,
    ack_transcript,
    encode,
    encode_tensor,
    fingerprint,
)
from tests.client.test_replies import err, ok

GOOD = np.zeros((5, 6), np.float32)


def chunk(robot: np.ndarray | Tensor, model: np.ndarray | None = None) -> ActionChunk:
    tensor = robot if isinstance(robot, Tensor) else encode_tensor(robot)
    return ActionChunk(tensor, 0.0, 0.0, chunk_model=None if model is None else encode_tensor(model))


def test_a_good_chunk_ships_one_tensor_for_both_spaces() -> None:
    model, robot = check_chunk(chunk(GOOD), action_dim=6, max_steps=50)
    assert model is robot
    model, robot = check_chunk(chunk(GOOD, GOOD + 1), action_dim=6, max_steps=50)
    np.testing.assert_array_equal(model, GOOD + 1)


NAN = GOOD.copy()
NAN[2, 3] = np.nan
BAD = {
    "3 columns": (chunk(GOOD[:, :3]), "shape"),
    "1-D": (chunk(GOOD[0]), "shape"),
    "3-D": (chunk(GOOD[None]), "shape"),
    "no steps": (chunk(GOOD[:0]), "shape"),
    "too many steps": (chunk(np.zeros((51, 6), np.float32)), "shape"),
    "model and robot differ in length": (chunk(GOOD, GOOD[:4]), "shape"),
    "float64": (chunk(GOOD.astype(np.float64)), "dtype"),
    "int32 model": (
        ActionChunk(encode_tensor(GOOD), 0.0, 0.0, chunk_model=encode_tensor(GOOD.astype(np.int32))),
        "dtype",
    ),
    "unknown dtype": (chunk(Tensor("complex", (5, 6), memoryview(bytes(240)))), "dtype"),
    "NaN": (chunk(NAN), "non_finite"),
    "inf in the model chunk": (chunk(GOOD, np.full((5, 6), np.inf, np.float32)), "non_finite"),
    "bytes do not match the shape": (chunk(Tensor("float32", (5, 6), memoryview(bytes(10)))), "undecodable"),
}


@pytest.mark.parametrize(("body", "reason"), BAD.values(), ids=BAD.keys())
def test_a_bad_chunk_is_rejected_with_its_reason(body: ActionChunk, reason: str) -> None:
    with pytest.raises(ChunkRejected) as info:
        check_chunk(body, action_dim=6, max_steps=50)
    assert info.value.reason == reason
    assert str(info.value)


def test_rejections_are_counted_by_reason_and_logged_once_per_second(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="servo")
    counters = ClientCounters(_throttle=LogThrottle(1.0, clock=lambda: 100.0))  # all within one second
    for _ in range(100):
        counters.reject("mac", "tag mismatch")
    counters.reject("shape", "3 columns")
    stats = counters.snapshot()
    assert stats.chunks_rejected == {**dict.fromkeys(REJECT_REASONS, 0), "mac": 100, "shape": 1}
    lines = [r.msg for r in caplog.records]
    assert len(lines) == 2  # one per reason within the second
    assert all("suppressed" in line for line in lines)  # type: ignore[operator]


def test_pins_parse_and_decide_trust() -> None:
    identity = ServerIdentity.generate().public_key
    pins = TrustedServers.parse([fingerprint(identity), "gpu-0"])
    assert pins.pinned
    assert pins.trusts("anything", identity)
    assert pins.trusts("gpu-0", bytes(32))
    assert not pins.trusts("gpu-1", bytes(32))
    assert TrustedServers().trusts("gpu-1", bytes(32))  # nothing pinned: anyone
    for bad in ["ed25519:", "ed25519:not-base64!", "ed25519:" + "A" * 42, "bad/replica", ""]:
        with pytest.raises(WireError):
            TrustedServers.parse([bad])


KEYS = ServerKeys("lab", "act", "r1")
INFO = PolicyInfo("m", "r", Features(["a"], ["a"], {"f": CameraFeature(8, 8)}), 4, 30.0, True, True, "shared")


def status(identity: bytes) -> StatusReply:
    return StatusReply("s", "lab", "act", "r1", [SCHEMA_VERSION], INFO, True, False, 0, 8, 0.0, identity)


def signed_ack(identity: ServerIdentity, client_key: bytes, replica: str = "r1") -> SessionAck:
    server_key, session_id = KeyPair().public_key, bytes(range(16))
    signature = identity.sign(ack_transcript(client_key, server_key, session_id, replica))
    return SessionAck(
        session_id, SCHEMA_VERSION, "s", replica, INFO, True, "", server_key, identity.public_key, signature
    )


def test_only_the_genuinely_signed_ack_is_picked() -> None:
    identity, impostor = ServerIdentity.generate(), ServerIdentity.generate()
    client_key = KeyPair().public_key
    genuine = signed_ack(identity, client_key)
    forgeries = [
        signed_ack(impostor, client_key),  # signed by another identity
        msgspec.structs.replace(signed_ack(impostor, client_key), server_identity=identity.public_key),
        msgspec.structs.replace(genuine, signature=bytes(64)),
        msgspec.structs.replace(genuine, session_id=bytes(16)),  # the signature covers the session id
        signed_ack(identity, KeyPair().public_key),  # made for another handshake
        signed_ack(identity, client_key, replica="r2"),
    ]
    counters = ClientCounters()
    replies = [ok(encode(f)) for f in forgeries] + [ok(b"\xc1garbage"), ok(encode(genuine))]
    picked = pick_ack(
        replies,  # type: ignore[arg-type]
        keys=KEYS,
        status=status(identity.public_key),
        client_key=client_key,
        counters=counters,
        timeout=1,
    )
    assert picked == genuine
    assert counters.rogue_servers == len(forgeries) + 1


def test_without_a_genuine_ack_a_refusal_wins_then_forgeries_then_silence() -> None:
    identity = ServerIdentity.generate()
    client_key = KeyPair().public_key
    forged = ok(encode(signed_ack(ServerIdentity.generate(), client_key)))
    refusal = err(encode(Rejection("capacity", "full")))
    kwargs = {"keys": KEYS, "status": status(identity.public_key), "client_key": client_key, "timeout": 1}
    with pytest.raises(SessionRejected):
        pick_ack([forged, refusal], counters=ClientCounters(), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(RogueServer):
        pick_ack([forged, err(b"Timeout")], counters=ClientCounters(), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(RequestTimeout):
        pick_ack([], counters=ClientCounters(), **kwargs)  # type: ignore[arg-type]
