import msgspec
import numpy as np
import pytest

from servo.wire import (
    ActionChunk,
    CloseRequest,
    ControlRequest,
    Observation,
    ResetRequest,
    SessionOpen,
    WireError,
    decode,
    decode_tensor,
    encode,
    encode_image,
    encode_tensor,
)
from servo.wire.messages import CameraFeature, Features


def sample_observation() -> Observation:
    return Observation(
        state=encode_tensor(np.arange(6, dtype=np.float32)),
        images={"front": encode_image(np.zeros((8, 8, 3), np.uint8), 90)},
        task="fold",
        inference_delay_steps=3,
        prefix_model=encode_tensor(np.ones((4, 6), np.float32)),
    )


def test_observation_round_trip() -> None:
    obs = decode(encode(sample_observation()), Observation)
    np.testing.assert_array_equal(decode_tensor(obs.state), np.arange(6, dtype=np.float32))
    assert obs.task == "fold"
    assert obs.inference_delay_steps == 3
    assert obs.prefix_robot is None
    assert obs.images["front"].codec == "jpeg"


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    class ObservationV2(msgspec.Struct):
        state: dict
        task: str
        hologram: str

    newer = msgspec.msgpack.encode(
        ObservationV2(state={"dtype": "float32", "shape": [0], "data": b""}, task="t", hologram="x")
    )
    assert decode(newer, Observation).task == "t"


def test_malformed_and_invalid_bodies_name_the_problem() -> None:
    with pytest.raises(WireError, match="malformed Observation"):
        decode(b"\xc1\xc1\xc1", Observation)
    bad = msgspec.msgpack.encode({"state": {"dtype": "float32", "shape": ["x"], "data": b""}})
    with pytest.raises(WireError, match=r"invalid Observation: .*\$\.state\.shape\[0\]"):
        decode(bad, Observation)
    with pytest.raises(WireError, match="missing required field `state`"):
        decode(msgspec.msgpack.encode({}), Observation)


def test_oversized_body_is_refused_before_decoding() -> None:
    with pytest.raises(WireError, match="exceeds the limit of 16"):
        decode(b"\x00" * 17, Observation, max_bytes=16)


SID = bytes(range(16))


def test_control_requests_are_a_tagged_union() -> None:
    assert decode(encode(ResetRequest(session_id=SID, episode_id=2)), ControlRequest) == ResetRequest(SID, 2)
    assert decode(encode(CloseRequest(session_id=SID)), ControlRequest) == CloseRequest(SID)
    with pytest.raises(WireError, match="invalid"):
        decode(msgspec.msgpack.encode({"type": "reboot", "session_id": SID}), ControlRequest)
    with pytest.raises(WireError, match=r"length >= 16 - at `\$\.session_id`"):
        decode(encode(CloseRequest(session_id=b"short")), ControlRequest)


def test_session_open_defaults_and_round_trip() -> None:
    features = Features(["a.pos"], ["a.pos"], {"front": CameraFeature(480, 640)})
    msg = SessionOpen(client_id="arm", schema_versions=[2], features=features, fps=30.0, client_key=bytes(32))
    back = decode(encode(msg), SessionOpen)
    assert back == msg
    assert back.tags == {}
    assert back.rtc is False
    assert back.resume == b""


def test_chunk_round_trip_is_exact_and_ships_one_tensor_when_both_are_equal() -> None:
    chunk = np.random.default_rng(0).standard_normal((50, 6)).astype(np.float32)
    msg = ActionChunk(encode_tensor(chunk * 2), queue_wait_ms=1.5, inference_ms=20.0, chunk_model=encode_tensor(chunk))
    back = decode(encode(msg), ActionChunk)
    np.testing.assert_array_equal(decode_tensor(back.chunk_robot), chunk * 2)
    assert back.chunk_model is not None
    np.testing.assert_array_equal(decode_tensor(back.chunk_model), chunk)
    assert back.superseded == 0
    single = encode(ActionChunk(encode_tensor(chunk), queue_wait_ms=1.5, inference_ms=20.0))
    assert decode(single, ActionChunk).chunk_model is None
    assert len(single) < len(encode(msg)) - chunk.nbytes
