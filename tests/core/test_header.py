"""servo._core attachment header codec (schema 2): golden vectors, errors, round trip."""

from __future__ import annotations

import contextlib
import os
import re
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from servo._core import (
    ATTACHMENT_SIZE,
    FLAG_EPISODE_START,
    HEADER_MAGIC,
    HEADER_SIZE,
    MSG_CHUNK,
    MSG_CONTROL,
    MSG_CONTROL_ACK,
    MSG_DRAIN,
    MSG_ERROR,
    MSG_OBS,
    SCHEMA_VERSION,
    SESSION_ID_SIZE,
    SUPPORTED_SCHEMA_VERSIONS,
    TAG_SIZE,
    Header,
    HeaderError,
    decode_header,
    unauthenticated,
)

SESSION = bytes(range(16))
ZERO_ID = bytes(16)

# Computed by hand from the layout (packed little-endian):
#   magic "SV" | schema_version u16 | msg_type u8 | flags u8 | seq_id u64 | episode_id u32 |
#   session_epoch u32 | client_mono_ns i64 | session_id (16 bytes)
GOLDEN = [
    (
        Header(
            schema_version=3,
            msg_type=MSG_OBS,
            flags=FLAG_EPISODE_START,
            seq_id=42,
            episode_id=7,
            session_epoch=3,
            client_mono_ns=123_456_789,  # 0x075BCD15
            session_id=ZERO_ID,
        ),
        "5356 0300 01 01 2a00000000000000 07000000 03000000 15cd5b0700000000 00000000000000000000000000000000",
    ),
    (
        Header(
            schema_version=3,
            msg_type=MSG_CHUNK,
            flags=0,
            seq_id=0x0102030405060708,
            episode_id=0xDEADBEEF,
            session_epoch=2**32 - 1,
            client_mono_ns=-2,
            session_id=ZERO_ID,
        ),
        "5356 0300 02 00 0807060504030201 efbeadde ffffffff feffffffffffffff 00000000000000000000000000000000",
    ),
    (
        Header(
            schema_version=3,
            msg_type=MSG_DRAIN,
            flags=0xFF,
            seq_id=2**64 - 1,
            episode_id=0,
            session_epoch=0,
            client_mono_ns=-(2**63),
            session_id=SESSION,
        ),
        "5356 0300 04 ff ffffffffffffffff 00000000 00000000 0000000000000080 000102030405060708090a0b0c0d0e0f",
    ),
    (
        Header(
            schema_version=3,
            msg_type=MSG_CONTROL_ACK,
            flags=0x80,
            seq_id=1,
            episode_id=1,
            session_epoch=2,
            client_mono_ns=0,
            session_id=bytes.fromhex("c0ffee00deadbeef0123456789abcdef"),
        ),
        "5356 0300 06 80 0100000000000000 01000000 02000000 0000000000000000 c0ffee00deadbeef0123456789abcdef",
    ),
]

LAYOUT = struct.Struct("<2sHBBQIIq16s")
TAG = bytes(range(0xA0, 0xB0))  # decode_header never looks at the tag


def attachment_bytes(**overrides: int | bytes) -> bytes:
    fields: dict[str, int | bytes] = {
        "magic": b"SV",
        "schema_version": 3,
        "msg_type": MSG_OBS,
        "flags": 0,
        "seq_id": 1,
        "episode_id": 2,
        "session_epoch": 3,
        "client_mono_ns": 4,
        "session_id": SESSION,
    }
    fields.update(overrides)
    return LAYOUT.pack(*fields.values()) + TAG


def test_constants() -> None:
    assert HEADER_SIZE == 46 == LAYOUT.size
    assert TAG_SIZE == 16
    assert SESSION_ID_SIZE == 16
    assert ATTACHMENT_SIZE == 62 == HEADER_SIZE + TAG_SIZE
    assert HEADER_MAGIC == b"SV"
    assert SCHEMA_VERSION == 3
    assert isinstance(SUPPORTED_SCHEMA_VERSIONS, frozenset)
    assert set(SUPPORTED_SCHEMA_VERSIONS) == {3}
    assert (MSG_OBS, MSG_CHUNK, MSG_ERROR, MSG_DRAIN, MSG_CONTROL, MSG_CONTROL_ACK) == (1, 2, 3, 4, 5, 6)
    assert FLAG_EPISODE_START == 1
    assert issubclass(HeaderError, ValueError)


@pytest.mark.parametrize(("header", "hex_bytes"), GOLDEN)
def test_golden_encode(header: Header, hex_bytes: str) -> None:
    assert unauthenticated(header) == bytes.fromhex(hex_bytes) + bytes(TAG_SIZE)


@pytest.mark.parametrize(("header", "hex_bytes"), GOLDEN)
def test_golden_decode(header: Header, hex_bytes: str) -> None:
    raw = bytes.fromhex(hex_bytes) + TAG
    assert decode_header(raw) == header
    assert decode_header(bytearray(raw)) == header
    assert decode_header(memoryview(raw)) == header
    assert decode_header(memoryview(b"xx" + raw)[2:]) == header
    assert decode_header(np.frombuffer(raw, np.uint8)) == header


def test_golden_matches_struct_layout() -> None:
    for header, hex_bytes in GOLDEN:
        fields = LAYOUT.unpack(bytes.fromhex(hex_bytes))
        assert fields == (
            b"SV",
            header.schema_version,
            header.msg_type,
            header.flags,
            header.seq_id,
            header.episode_id,
            header.session_epoch,
            header.client_mono_ns,
            header.session_id,
        )


V1_HEADER = bytes.fromhex("5356 0100 01 01 2a00000000000000 07000000 03000000 15cd5b0700000000")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x00" * 12, "attachment is 12 bytes, expected 62"),
        (b"", "attachment is 0 bytes, expected 62"),
        (attachment_bytes()[:HEADER_SIZE], "attachment is 46 bytes, expected 62"),
        (attachment_bytes() + b"\x00", "attachment is 63 bytes, expected 62"),
        (V1_HEADER, "attachment is 30 bytes, expected 62"),
        (V1_HEADER + bytes(32), r"unsupported schema_version 1 \(supported: 3\)"),
        (attachment_bytes(magic=b"XX"), "bad magic b'XX', expected b'SV'"),
        (attachment_bytes(magic=b"\x00S"), re.escape("bad magic b'\\x00S', expected b'SV'")),
        (attachment_bytes(schema_version=1), r"^unsupported schema_version 1 \(supported: 3\)$"),
        (attachment_bytes(schema_version=2), r"^unsupported schema_version 2 \(supported: 3\)$"),
        (attachment_bytes(schema_version=7), r"unsupported schema_version 7 \(supported: 3\)"),
        (attachment_bytes(schema_version=0), "unsupported schema_version 0"),
        (attachment_bytes(msg_type=9), r"unknown msg_type 9 \(known: 1, 2, 3, 4, 5, 6\)"),
        (attachment_bytes(msg_type=0), "unknown msg_type 0"),
    ],
)
def test_decode_errors(raw: bytes, message: str) -> None:
    with pytest.raises(HeaderError, match=message):
        decode_header(raw)


def test_decode_checks_length_before_magic() -> None:
    with pytest.raises(HeaderError, match="attachment is 2 bytes"):
        decode_header(b"XX")


def test_decode_rejects_non_buffers() -> None:
    with pytest.raises(TypeError):
        decode_header("SV" * 31)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value", "wire_type"),
    [
        ("schema_version", 2**16, "u16"),
        ("schema_version", -1, "u16"),
        ("msg_type", 256, "u8"),
        ("flags", 256, "u8"),
        ("flags", -1, "u8"),
        ("seq_id", 2**64, "u64"),
        ("seq_id", -1, "u64"),
        ("seq_id", 2**200, "u64"),
        ("episode_id", 2**32, "u32"),
        ("session_epoch", -1, "u32"),
        ("client_mono_ns", 2**63, "i64"),
        ("client_mono_ns", -(2**63) - 1, "i64"),
    ],
)
def test_out_of_range_fields_name_the_field(field: str, value: int, wire_type: str) -> None:
    base = GOLDEN[0][0]
    with pytest.raises(HeaderError, match=rf"^{field}={value} does not fit {wire_type}"):
        base.replace(**{field: value})
    kwargs: dict[str, int | bytes] = {name: getattr(base, name) for name in LAYOUT_FIELDS}
    kwargs[field] = value
    with pytest.raises(HeaderError, match=field):
        Header(**kwargs)  # type: ignore[arg-type]


LAYOUT_FIELDS = (
    "schema_version",
    "msg_type",
    "flags",
    "seq_id",
    "episode_id",
    "session_epoch",
    "client_mono_ns",
    "session_id",
)


@pytest.mark.parametrize("session_id", [b"", bytes(15), bytes(17), bytes(32)])
def test_session_id_must_be_16_bytes(session_id: bytes) -> None:
    message = rf"^session_id is {len(session_id)} bytes, expected 16$"
    with pytest.raises(HeaderError, match=message):
        GOLDEN[0][0].replace(session_id=session_id)
    with pytest.raises(HeaderError, match=message):
        Header(2, MSG_OBS, 0, 0, 0, 0, 0, session_id)


@pytest.mark.parametrize("session_id", [7, bytearray(16), "0" * 16, None])
def test_session_id_must_be_bytes(session_id: object) -> None:
    with pytest.raises(TypeError, match="session_id must be bytes, not"):
        GOLDEN[0][0].replace(session_id=session_id)  # type: ignore[arg-type]


def test_encode_rejects_unknown_msg_type_and_schema_version() -> None:
    base = GOLDEN[0][0]
    with pytest.raises(HeaderError, match="unknown msg_type 9"):
        unauthenticated(base.replace(msg_type=9))
    with pytest.raises(HeaderError, match=r"unsupported schema_version 1 \(supported: 3\)"):
        unauthenticated(base.replace(schema_version=1))


def test_non_int_fields_are_type_errors() -> None:
    with pytest.raises(TypeError):
        GOLDEN[0][0].replace(seq_id=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        GOLDEN[0][0].replace(bogus=1)


def test_header_record() -> None:
    header = GOLDEN[0][0]
    assert header == Header(3, MSG_OBS, FLAG_EPISODE_START, 42, 7, 3, 123_456_789, ZERO_ID)
    assert header != header.replace(seq_id=43)
    assert header != header.replace(session_id=SESSION)
    assert hash(header) == hash(header.replace())
    assert header.replace(seq_id=43).seq_id == 43
    assert header.replace(session_id=SESSION).session_id == SESSION
    assert repr(header) == (
        "Header(schema_version=3, msg_type=1, flags=1, seq_id=42, episode_id=7, "
        "session_epoch=3, client_mono_ns=123456789, "
        "session_id=bytes.fromhex('00000000000000000000000000000000'))"
    )
    assert eval(repr(GOLDEN[2][0]), {"Header": Header}) == GOLDEN[2][0]
    with pytest.raises(AttributeError):
        header.seq_id = 3  # type: ignore[misc]


headers = st.builds(
    Header,
    schema_version=st.sampled_from(sorted(SUPPORTED_SCHEMA_VERSIONS)),
    msg_type=st.sampled_from([MSG_OBS, MSG_CHUNK, MSG_ERROR, MSG_DRAIN, MSG_CONTROL, MSG_CONTROL_ACK]),
    flags=st.integers(0, 2**8 - 1),
    seq_id=st.integers(0, 2**64 - 1),
    episode_id=st.integers(0, 2**32 - 1),
    session_epoch=st.integers(0, 2**32 - 1),
    client_mono_ns=st.integers(-(2**63), 2**63 - 1),
    session_id=st.binary(min_size=16, max_size=16),
)


@given(headers, st.binary(min_size=16, max_size=16))
def test_round_trip(header: Header, tag: bytes) -> None:
    raw = unauthenticated(header)
    assert len(raw) == ATTACHMENT_SIZE
    assert decode_header(raw) == header
    assert decode_header(raw[:HEADER_SIZE] + tag) == header
    assert raw == LAYOUT.pack(
        b"SV",
        header.schema_version,
        header.msg_type,
        header.flags,
        header.seq_id,
        header.episode_id,
        header.session_epoch,
        header.client_mono_ns,
        header.session_id,
    ) + bytes(TAG_SIZE)


@given(st.one_of(st.binary(max_size=80), st.binary(min_size=62, max_size=62).map(lambda b: b"SV\x03\x00" + b[4:])))
def test_decode_arbitrary_bytes_never_crashes(raw: bytes) -> None:
    try:
        header = decode_header(raw)
    except HeaderError:
        return
    assert unauthenticated(header)[:HEADER_SIZE] == raw[:HEADER_SIZE]


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_encode_decode_keeps_rss_bounded() -> None:
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    header = GOLDEN[1][0]
    for _ in range(1_000):
        decode_header(unauthenticated(header))
    before = rss()
    for i in range(10_000):
        decode_header(unauthenticated(header.replace(seq_id=i)))
        with contextlib.suppress(HeaderError):
            decode_header(b"XX" * 31)
    assert rss() - before < 8 * 2**20
