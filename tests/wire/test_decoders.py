"""Every decoder raises `WireError` and nothing else, whatever the bytes (property-based).

Each message type is fed arbitrary bytes and mutations of a valid encoding (byte flips, cuts,
invalid UTF-8 spliced into its strings); the tensor and image decoders get whatever the message
decoder let through. A receiver relies on this contract to turn hostile input into one counted,
logged rejection: a `UnicodeDecodeError` escaping `servo.wire.decode` once stopped edges from
starting (issue 8).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servo.recording import MAGIC, read_recording
from servo.wire import (
    MESSAGE_TYPES,
    ActionChunk,
    AuditEntry,
    AuditQuery,
    AuditTail,
    CameraFeature,
    CloseRequest,
    ControlAck,
    ControlRequest,
    DrainNotice,
    EdgeTelemetry,
    EncodedImage,
    ErrorEvent,
    Features,
    Observation,
    PolicyInfo,
    Rejection,
    ResetRequest,
    SealedTelemetry,
    SessionAck,
    SessionOpen,
    StatusReply,
    Tensor,
    Trajectory,
    TrajectoryList,
    TrajectoryRequest,
    Transition,
    WireError,
    decode,
    decode_image,
    decode_tensor,
    encode,
    encode_image,
    encode_tensor,
    jpeg_dimensions,
)
from servo.wire.telemetry import SealedCopy

FEATURES = Features(["a", "b"], ["a", "b"], {"front": CameraFeature(8, 8)})
INFO = PolicyInfo("m", "r", FEATURES, 4, 30.0, True, True, "shared")
STATE = encode_tensor(np.zeros(2, np.float32))

#: One valid message of each type: the seeds the mutations start from.
SAMPLES: dict[type, msgspec.Struct] = {
    StatusReply: StatusReply("s", "app", "m", "r", [2], INFO, True, False, 0, 8, 0.0, bytes(32)),
    SessionOpen: SessionOpen("robot", [2], FEATURES, 30.0, bytes(32), task="fold", tags={"k": "v"}),
    SessionAck: SessionAck(
        bytes(16), 3, "s", "r", INFO, True, "fold", bytes(32), bytes(32), bytes(64), ["w"], operators=[bytes(32)]
    ),
    Rejection: Rejection("capacity", "full", 1, 1, 1.0),
    ResetRequest: ResetRequest(bytes(16), 1),
    CloseRequest: CloseRequest(bytes(16)),
    ControlAck: ControlAck(bytes(16), 1),
    Observation: Observation(STATE, {"front": encode_image(np.zeros((8, 8, 3), np.uint8), 90)}, "fold", 2),
    ActionChunk: ActionChunk(encode_tensor(np.zeros((4, 2), np.float32)), 1.0, 2.0),
    ErrorEvent: ErrorEvent("bad_observation", "why"),
    DrainNotice: DrainNotice("bye"),
    TrajectoryRequest: TrajectoryRequest("wave", bytes(16), bytes(32), "robot-7", bytes(32), bytes(64)),
    Trajectory: Trajectory("wave", ["a", "b"], 30.0, encode_tensor(np.zeros((3, 2), np.float32))),
    TrajectoryList: TrajectoryList(["wave"]),
    EdgeTelemetry: EdgeTelemetry(
        "robot",
        7,
        3,
        1000.0,
        "streaming",
        replica="r0",
        rtt_ms_p50=12.5,
        chunks_rejected={"mac": 1},
        last_transition=Transition("streaming", "chunk merged", 5.0),
        transitions=[Transition("streaming", "chunk merged", 5.0)],
    ),
    SealedTelemetry: SealedTelemetry("robot", [SealedCopy(bytes(8), bytes(32), bytes(62), b"ciphertext")]),
    AuditQuery: AuditQuery("robot", True, 8, bytes(32), bytes(32), bytes(16), bytes(64)),
    AuditTail: AuditTail(
        "r0", [AuditEntry("robot", "ab" * 16, 3, 1, "ok", 1.0, 20.0, 22.0, 0, 150.0)], {"robot": bytes(32)}
    ),
}
KINDS: list[object] = [*MESSAGE_TYPES, ControlRequest, Tensor, EncodedImage]


def test_every_message_type_has_a_sample() -> None:
    assert set(MESSAGE_TYPES) == set(SAMPLES)


def decode_all_the_way(buf: bytes, kind: object) -> None:
    """Decode ``buf`` as ``kind`` and every tensor and image inside; only WireError may escape."""
    try:
        message = decode(buf, kind)  # type: ignore[call-overload]
    except WireError:
        return
    tensors = [getattr(message, name, None) for name in ("state", "chunk_robot", "chunk_model", "positions")]
    for tensor in [message, *tensors] if isinstance(message, Tensor) else tensors:
        if isinstance(tensor, Tensor):
            with contextlib.suppress(WireError):
                decode_tensor(tensor)
    images = getattr(message, "images", {}) or {}
    for image in [*images.values(), *([message] if isinstance(message, EncodedImage) else [])]:
        with contextlib.suppress(WireError):
            decode_image(image, max_pixels=64 * 64)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: getattr(k, "__name__", "ControlRequest"))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_arbitrary_bytes(kind: object, data: bytes) -> None:
    decode_all_the_way(data, kind)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[type, bytes]:
    kind = draw(st.sampled_from(sorted(SAMPLES, key=lambda k: k.__name__)))
    buf = bytearray(encode(SAMPLES[kind]))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "utf8", "insert"]))
        at = draw(st.integers(0, max(0, len(buf) - 1)))
        if op == "flip" and buf:
            buf[at] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del buf[at:]
        elif op == "utf8":
            # Overwrite a string's payload with bytes that are never valid UTF-8.
            bad = draw(st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]))
            buf[at : at + len(bad)] = bad
        else:
            buf[at:at] = draw(st.binary(min_size=1, max_size=8))
    return kind, bytes(buf)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutations_of_valid_messages(case: tuple[type, bytes]) -> None:
    kind, buf = case
    decode_all_the_way(buf, kind)


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, msgspec.Struct):
        return [s for name in value.__struct_fields__ for s in _strings(getattr(value, name))]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


WITH_STRINGS = sorted((k for k, v in SAMPLES.items() if any(_strings(v))), key=lambda k: k.__name__)


@pytest.mark.parametrize("kind", WITH_STRINGS, ids=lambda k: k.__name__)
def test_invalid_utf8_in_any_string_is_a_wire_error(kind: type) -> None:
    """The reproduction of issue 8: one status reply with invalid UTF-8 escaped as UnicodeDecodeError."""
    buf = encode(SAMPLES[kind])
    spliced = 0
    for text in sorted({s for s in _strings(SAMPLES[kind]) if s}, key=len, reverse=True):
        packed = msgspec.msgpack.encode(text)
        if packed in buf:
            buf = buf.replace(packed, packed[: len(packed) - len(text)] + b"\xff" * len(text.encode()))
            spliced += 1
    assert spliced, kind
    with pytest.raises(WireError, match="not valid UTF-8"):
        decode(buf, kind)


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.binary(max_size=256))
def test_recording_reader(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.servo"
    path.write_bytes(MAGIC + data)
    with contextlib.suppress(WireError):
        read_recording(path)


JPEG = bytes(encode_image(np.zeros((24, 32, 3), np.uint8), 80).data)


@given(
    st.binary(max_size=256)
    | st.builds(lambda cut, flip: _flip(JPEG[:cut], flip), st.integers(0, len(JPEG)), st.integers(0, 10**6))
)
def test_jpeg_frame_header_reader(data: bytes) -> None:
    """`jpeg_dimensions` answers a size or a `WireError`, whatever the bytes, and never walks far."""
    with contextlib.suppress(WireError):
        height, width = jpeg_dimensions(data)
        assert 1 <= height <= 65535
        assert 1 <= width <= 65535


def _flip(data: bytes, at: int) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    out[at % len(out)] ^= 0xFF
    return bytes(out)


def test_jpeg_frame_header_reader_agrees_with_libjpeg() -> None:
    import simplejpeg

    for shape in ((24, 32), (480, 640), (1, 1), (1080, 1920)):
        data = bytes(encode_image(np.zeros((*shape, 3), np.uint8), 80).data)
        assert jpeg_dimensions(data) == shape == simplejpeg.decode_jpeg_header(data)[:2]
    lying = bytearray(JPEG)
    sof = lying.index(b"\xff\xc0")
    lying[sof + 5 : sof + 9] = (8192).to_bytes(2, "big") * 2
    assert jpeg_dimensions(bytes(lying)) == (8192, 8192)
    with pytest.raises(WireError, match="segments"):
        jpeg_dimensions(b"\xff\xd8" + b"\xff\xe0\x00\x02" * 100 + JPEG[2:])
