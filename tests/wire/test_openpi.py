"""openpi's formats: msgpack-numpy both ways against openpi's own codec, observation dict mapping."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from openpi_client import msgpack_numpy

from servo.wire import CameraFeature, Features, WireError
from servo.wire.openpi import ObservationKeys, action_reply, pack, read_observation, unpack

FEATURES = Features(
    state_names=["a", "b", "c"],
    action_names=["a", "b", "c"],
    cameras={"top": CameraFeature(4, 6)},
)
LIMIT = 1 << 20


@pytest.mark.parametrize("dtype", ["uint8", "int16", "int64", "float16", "float32", "float64", "bool", ">f8"])
def test_arrays_from_openpi_decode_exactly(dtype: str) -> None:
    array = (np.arange(24) % 2 if dtype == "bool" else np.arange(24)).astype(dtype).reshape(2, 3, 4)
    message = {"nested": {"x": array}, "items": [array[0], 3], "s": np.float32(1.5), "text": "hi"}
    decoded = unpack(msgpack_numpy.packb(message), max_bytes=LIMIT)
    for got in (decoded["nested"]["x"], decoded["items"][0]):
        assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(decoded["nested"]["x"], array)
    np.testing.assert_array_equal(decoded["items"][0], array[0])
    assert decoded["items"][1] == 3
    assert decoded["s"] == np.float32(1.5)
    assert decoded["s"].dtype == np.float32
    assert decoded["text"] == "hi"


def test_replies_decode_with_openpi_codec() -> None:
    actions = np.arange(12, dtype=np.float32).reshape(4, 3)
    reply = action_reply(actions, infer_ms=2.0, policy_ms=1.0, queue_wait_ms=0.5, seq_id=7, episode_id=2)
    reply["empty"] = np.zeros((0, 3), np.float32)
    reply["strided"] = actions[:, ::2]  # not contiguous: copied, not sent wrong
    decoded = msgpack_numpy.unpackb(pack(reply))
    np.testing.assert_array_equal(decoded["actions"], actions)
    np.testing.assert_array_equal(decoded["strided"], actions[:, ::2])
    assert decoded["empty"].shape == (0, 3)
    assert decoded["server_timing"] == {"infer_ms": 2.0, "queue_wait_ms": 0.5}
    assert decoded["policy_timing"] == {"infer_ms": 1.0}
    assert decoded["servo"] == {"seq_id": 7, "episode_id": 2}


def _array(dtype: Any, shape: Any, data: bytes = b"") -> bytes:
    return msgpack_numpy.packb({"x": {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}})


MALFORMED = {
    "object dtype": (_array("|O", [0]), "$.x: unsupported array dtype '|O'"),
    "record dtype": (_array([("a", "<i4")], [0]), "$.x: unsupported array dtype"),
    "complex dtype": (_array("<c8", [0]), "$.x: unsupported array dtype '<c8'"),
    "unknown dtype": (_array("zz", [0]), "$.x: unsupported array dtype 'zz'"),
    "negative shape": (_array("<f4", [-1]), "$.x: array shape must be a list"),
    "shape of text": (_array("<f4", "3"), "$.x: array shape must be a list"),
    "too many dims": (_array("<f4", [1] * 9, b"\0" * 4), "$.x: array shape must be a list of at most 8"),
    "data too short": (_array("<f4", [3], b"\0" * 4), "$.x: float32 array of shape (3,) needs 12 bytes, got 4"),
    "data not bytes": (
        msgpack_numpy.packb({"x": {b"__ndarray__": True, b"data": "abc", b"dtype": "|u1", b"shape": [3]}}),
        "$.x: array data must be bytes",
    ),
    "scalar overflow": (
        msgpack_numpy.packb({"x": {b"__npgeneric__": True, b"data": 300, b"dtype": "|u1"}}),
        "$.x: 300 is not a valid uint8",
    ),
    "not msgpack": (b"\xc1", "not a msgpack message"),
    "too deep": (b"\x91" * 40 + b"\xc0", "nested deeper than 16 levels"),
    "far too deep": (b"\x91" * 100_000 + b"\xc0", "nested deeper than 16 levels"),
}


@pytest.mark.parametrize(("data", "message"), MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_messages_are_wire_errors(data: bytes, message: str) -> None:
    with pytest.raises(WireError) as refused:
        unpack(data, max_bytes=LIMIT)
    assert message in str(refused.value)


def test_oversized_message_is_refused_before_decoding() -> None:
    with pytest.raises(WireError, match="message of 2048 bytes exceeds the limit of 1024"):
        unpack(b"\0" * 2048, max_bytes=1024)


def test_aloha_style_observation_with_channels_first_frames() -> None:
    frame = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    obs = {"state": [1, 2, 3], "images": {"top": frame.transpose(2, 0, 1)}, "prompt": "go"}
    read = read_observation(obs, ObservationKeys(), FEATURES)
    assert read.state.dtype == np.float32
    np.testing.assert_array_equal(read.state, [1, 2, 3])
    np.testing.assert_array_equal(read.images["top"], frame)
    assert read.images["top"].flags.c_contiguous
    assert read.prompt == "go"


def test_literal_keys_win_over_nested_paths_and_the_prompt_is_optional() -> None:
    frame = np.zeros((4, 6, 3), np.uint8)
    keys = ObservationKeys(state=["observation/joints", "observation/gripper"], cameras={"top": "observation/top"})
    obs = {
        "observation/joints": np.array([1.0, 2.0]),
        "observation/gripper": np.float64(3.0),
        "observation/top": frame,
        "observation": {"top": np.ones((4, 6, 3), np.uint8)},  # the literal key is used, not this
    }
    read = read_observation(obs, keys, FEATURES)
    np.testing.assert_array_equal(read.state, [1, 2, 3])
    assert read.images["top"] is frame
    assert read.prompt == ""


@pytest.mark.parametrize(
    ("obs", "message"),
    [
        ({"state": [[1, 2], [3]]}, "'state': expected a 1-D numeric array (state), got list"),
        ({"state": ["a", "b", "c"]}, "'state': expected a 1-D numeric array (state), got list"),
        ({f"k{i}": 0 for i in range(20)}, "observation has no 'state' (state); it has 'k0', 'k1',"),
    ],
    ids=["ragged", "strings", "many keys"],
)
def test_unusable_state_is_named(obs: dict[str, Any], message: str) -> None:
    with pytest.raises(WireError) as refused:
        read_observation(obs, ObservationKeys(), FEATURES)
    assert message in str(refused.value)
    assert len(str(refused.value)) < 200


def test_a_frame_no_camera_reads_or_one_too_small_to_enlarge_is_named() -> None:
    frame = np.zeros((4, 6, 3), np.uint8)
    big = Features(["a"], ["a"], {"top": CameraFeature(96, 128)})
    with pytest.raises(WireError, match=r"^'images/side': the policy has no camera 'side' \(it has top\)"):
        read_observation(
            {"state": [1], "images/top": np.zeros((96, 128, 3), np.uint8), "images/side": frame}, ObservationKeys(), big
        )
    with pytest.raises(WireError, match=r"^'images/top' \(camera 'top'\): a 4x6 frame; .* send at least 12x16"):
        read_observation({"state": [1], "images": {"top": frame}}, ObservationKeys(), big)
    # A mapped camera's key is read, not refused; frames elsewhere are not cameras.
    keys = ObservationKeys(cameras={"top": "images/wide"})
    read = read_observation({"state": [1], "images": {"wide": np.zeros((12, 16, 3), np.uint8)}, "x": frame}, keys, big)
    assert read.images["top"].shape == (12, 16, 3)
