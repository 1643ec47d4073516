"""servo._core attachment header codec: golden vectors, errors, round trip."""

from __future__ import annotations

import contextlib
import os
import re
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servo._core import (
    FLAG_EPISODE_START,
    HEADER_MAGIC,
    HEADER_SIZE,
    MSG_CHUNK,
    MSG_DRAIN,
    MSG_ERROR,
    MSG_OBS,
    SCHEMA_VERSION,
    SUPPORTED_SCHEMA_VERSIONS,
    Header,
    HeaderError,
    decode_header,
    encode_header,
)

# Computed by hand from the layout (packed little-endian):
#   magic "SV" | schema_version u16 | msg_type u8 | flags u8 | seq_id u64 | episode_id u32 |
#   session_epoch u32 | client_mono_ns i64
GOLDEN = [
    (
        Header(
            schema_version=1,
            msg_type=MSG_OBS,
            flags=FLAG_EPISODE_START,
            seq_id=42,
            episode_id=7,
            session_epoch=3,
            client_mono_ns=123_456_789,  # 0x075BCD15
        ),
        "5356 0100 01 01 2a00000000000000 07000000 03000000 15cd5b0700000000",
    ),
    (
        Header(
            schema_version=1,
            msg_type=MSG_CHUNK,
            flags=0,
            seq_id=0x0102030405060708,
            episode_id=0xDEADBEEF,
            session_epoch=2**32 - 1,
            client_mono_ns=-2,
        ),
        "5356 0100 02 00 0807060504030201 efbeadde ffffffff feffffffffffffff",
    ),
    (
        Header(
            schema_version=1,
            msg_type=MSG_DRAIN,
            flags=0xFF,
            seq_id=2**64 - 1,
            episode_id=0,
            session_epoch=0,
            client_mono_ns=-(2**63),
        ),
        "5356 0100 04 ff ffffffffffffffff 00000000 00000000 0000000000000080",
    ),
]

LAYOUT = struct.Struct("<2sHBBQIIq")


def header_bytes(**overrides: int | bytes) -> bytes:
    fields: dict[str, int | bytes] = {
        "magic": b"SV",
        "schema_version": 1,
        "msg_type": MSG_OBS,
        "flags": 0,
        "seq_id": 1,
        "episode_id": 2,
        "session_epoch": 3,
        "client_mono_ns": 4,
    }
    fields.update(overrides)
    return LAYOUT.pack(*fields.values())


def test_constants() -> None:
    assert HEADER_SIZE == 30 == LAYOUT.size
    assert HEADER_MAGIC == b"SV"
    assert SCHEMA_VERSION == 1
    assert isinstance(SUPPORTED_SCHEMA_VERSIONS, frozenset)
    assert set(SUPPORTED_SCHEMA_VERSIONS) == {1}
    assert (MSG_OBS, MSG_CHUNK, MSG_ERROR, MSG_DRAIN) == (1, 2, 3, 4)
    assert FLAG_EPISODE_START == 1
    assert issubclass(HeaderError, ValueError)


@pytest.mark.parametrize(("header", "hex_bytes"), GOLDEN)
def test_golden_encode(header: Header, hex_bytes: str) -> None:
    assert encode_header(header) == bytes.fromhex(hex_bytes)


@pytest.mark.parametrize(("header", "hex_bytes"), GOLDEN)
def test_golden_decode(header: Header, hex_bytes: str) -> None:
    raw = bytes.fromhex(hex_bytes)
    assert decode_header(raw) == header
    assert decode_header(bytearray(raw)) == header
    assert decode_header(memoryview(raw)) == header
    assert decode_header(memoryview(b"xx" + raw)[2:]) == header


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
        )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x00" * 12, "header is 12 bytes, expected 30"),
        (b"", "header is 0 bytes, expected 30"),
        (header_bytes() + b"\x00", "header is 31 bytes, expected 30"),
        (header_bytes(magic=b"XX"), "bad magic b'XX', expected b'SV'"),
        (header_bytes(magic=b"\x00S"), re.escape("bad magic b'\\x00S', expected b'SV'")),
        (header_bytes(schema_version=7), r"unsupported schema_version 7 \(supported: 1\)"),
        (header_bytes(schema_version=0), "unsupported schema_version 0"),
        (header_bytes(msg_type=9), "unknown msg_type 9"),
        (header_bytes(msg_type=0), "unknown msg_type 0"),
    ],
)
def test_decode_errors(raw: bytes, message: str) -> None:
    with pytest.raises(HeaderError, match=message):
        decode_header(raw)


def test_decode_checks_length_before_magic() -> None:
    with pytest.raises(HeaderError, match="header is 2 bytes"):
        decode_header(b"XX")


def test_decode_rejects_non_buffers() -> None:
    with pytest.raises(TypeError):
        decode_header("SV" * 15)  # type: ignore[arg-type]


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
        encode_header(base.replace(**{field: value}))
    kwargs = {name: getattr(base, name) for name in LAYOUT_FIELDS}
    kwargs[field] = value
    with pytest.raises(HeaderError, match=field):
        encode_header(Header(**kwargs))


LAYOUT_FIELDS = (
    "schema_version",
    "msg_type",
    "flags",
    "seq_id",
    "episode_id",
    "session_epoch",
    "client_mono_ns",
)


def test_encode_rejects_unknown_msg_type_and_schema_version() -> None:
    base = GOLDEN[0][0]
    with pytest.raises(HeaderError, match="unknown msg_type 9"):
        encode_header(base.replace(msg_type=9))
    with pytest.raises(HeaderError, match=r"unsupported schema_version 2 \(supported: 1\)"):
        encode_header(base.replace(schema_version=2))


def test_non_int_fields_are_type_errors() -> None:
    with pytest.raises(TypeError):
        GOLDEN[0][0].replace(seq_id=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        GOLDEN[0][0].replace(bogus=1)


def test_header_record() -> None:
    header = GOLDEN[0][0]
    assert header == Header(1, MSG_OBS, FLAG_EPISODE_START, 42, 7, 3, 123_456_789)
    assert header != header.replace(seq_id=43)
    assert hash(header) == hash(header.replace())
    assert header.replace(seq_id=43).seq_id == 43
    assert repr(header) == (
        "Header(schema_version=1, msg_type=1, flags=1, seq_id=42, episode_id=7, "
        "session_epoch=3, client_mono_ns=123456789)"
    )
    with pytest.raises(AttributeError):
        header.seq_id = 3  # type: ignore[misc]


headers = st.builds(
    Header,
    schema_version=st.sampled_from(sorted(SUPPORTED_SCHEMA_VERSIONS)),
    msg_type=st.sampled_from([MSG_OBS, MSG_CHUNK, MSG_ERROR, MSG_DRAIN]),
    flags=st.integers(0, 2**8 - 1),
    seq_id=st.integers(0, 2**64 - 1),
    episode_id=st.integers(0, 2**32 - 1),
    session_epoch=st.integers(0, 2**32 - 1),
    client_mono_ns=st.integers(-(2**63), 2**63 - 1),
)


@given(headers)
def test_round_trip(header: Header) -> None:
    raw = encode_header(header)
    assert len(raw) == HEADER_SIZE
    assert decode_header(raw) == header
    assert raw == LAYOUT.pack(
        b"SV",
        header.schema_version,
        header.msg_type,
        header.flags,
        header.seq_id,
        header.episode_id,
        header.session_epoch,
        header.client_mono_ns,
    )


@given(st.binary(max_size=40))
def test_decode_arbitrary_bytes_never_crashes(raw: bytes) -> None:
    try:
        header = decode_header(raw)
    except HeaderError:
        return
    assert encode_header(header) == raw


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_encode_decode_keeps_rss_bounded() -> None:
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    header = GOLDEN[1][0]
    for _ in range(1_000):
        decode_header(encode_header(header))
    before = rss()
    for i in range(10_000):
        decode_header(encode_header(header.replace(seq_id=i)))
        with contextlib.suppress(HeaderError):
            decode_header(b"XX" * 15)
    assert rss() - before < 8 * 2**20
