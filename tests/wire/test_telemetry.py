"""Edge telemetry on the wire: the key, the signature (checked before decoding), one copy per reader, the bounds."""

from __future__ import annotations

import math

import msgspec
import pytest
import zenoh

from servo._core import ServerIdentity
from servo.wire import (
    TELEMETRY_SELECTOR,
    EdgeTelemetry,
    SealedTelemetry,
    Transition,
    WireError,
    decode,
    encode,
    open_telemetry,
    seal_telemetry,
    telemetry_signer,
)
from servo.wire.telemetry import MAX_READERS, client_of_telemetry, signed_bytes, telemetry_key

ROBOT = ServerIdentity.from_seed(bytes(range(32)))
OPS = ServerIdentity.from_seed(bytes(range(1, 33)))
OTHER_OPS = ServerIdentity.from_seed(bytes(range(2, 34)))


def record(client_id: str = "robot-7", **changes: object) -> EdgeTelemetry:
    base = EdgeTelemetry(
        client_id, 3, 1, 1000.0, "streaming", replica="r0", last_transition=Transition("streaming", "x", 1.0)
    )
    return msgspec.structs.replace(base, **changes)


def test_each_reader_decrypts_its_own_copy_of_a_signed_record() -> None:
    body, attachment = seal_telemetry(record(), ROBOT, [OPS.public_key, OTHER_OPS.public_key])
    assert telemetry_signer(telemetry_key("robot-7"), len(body), attachment) == ("robot-7", ROBOT.public_key)
    for reader in (OPS, OTHER_OPS):
        assert open_telemetry(telemetry_key("robot-7"), body, attachment, reader) == record()
    with pytest.raises(WireError, match="not encrypted to this reader"):
        open_telemetry(telemetry_key("robot-7"), body, attachment, ServerIdentity.generate())


def test_nothing_of_a_record_is_readable_without_a_readers_key() -> None:
    body, _ = seal_telemetry(record(replica="kitchen-replica", model="secret-model"), ROBOT, [OPS.public_key])
    assert b"kitchen-replica" not in body
    assert b"secret-model" not in body
    assert b"streaming" not in body
    sealed = decode(body, SealedTelemetry)
    assert sealed.client_id == "robot-7"  # only what the key already says
    with pytest.raises(WireError):
        decode(sealed.copies[0].ciphertext, EdgeTelemetry)


def test_readers_are_deduplicated_and_bounded() -> None:
    readers = [OPS.public_key] * 3 + [ServerIdentity.generate().public_key for _ in range(MAX_READERS + 2)]
    body, _ = seal_telemetry(record(), ROBOT, readers)
    assert len(decode(body, SealedTelemetry).copies) == MAX_READERS


def test_the_key_is_outside_every_server_wildcard() -> None:
    key = zenoh.KeyExpr(telemetry_key("robot-7"))
    assert zenoh.KeyExpr(TELEMETRY_SELECTOR).intersects(key)
    for pattern in ("@servo/*/*/*/status", "@servo/*/*/*/c/*/obs", "@servo/**"):
        assert not zenoh.KeyExpr(pattern).intersects(key), pattern
    assert client_of_telemetry(str(key)) == "robot-7"
    with pytest.raises(WireError, match="client_id"):
        telemetry_key("robot/*")


@pytest.mark.parametrize("at", [0, 10, -1])
def test_any_changed_byte_of_the_body_is_refused_before_decoding(at: int) -> None:
    body, attachment = seal_telemetry(record(), ROBOT, [OPS.public_key])
    tampered = bytearray(body)
    tampered[at] ^= 0x01
    with pytest.raises(WireError, match="signature"):
        open_telemetry(telemetry_key("robot-7"), bytes(tampered), attachment, OPS)


def test_a_record_replayed_on_another_robots_key_is_refused() -> None:
    body, attachment = seal_telemetry(record("robot-7"), ROBOT, [OPS.public_key])
    with pytest.raises(WireError, match="signature"):
        open_telemetry(telemetry_key("robot-8"), body, attachment, OPS)


def test_a_signed_message_naming_another_robot_is_refused() -> None:
    # Signed honestly for robot-8's key, but claiming to be robot-7 inside.
    forged = encode(SealedTelemetry("robot-7", []))
    attachment = ROBOT.public_key + ROBOT.sign(signed_bytes("robot-8", forged))
    with pytest.raises(WireError, match="names client"):
        open_telemetry(telemetry_key("robot-8"), forged, attachment, OPS)


@pytest.mark.parametrize("attachment", [None, b"", bytes(95), bytes(97)])
def test_a_missing_or_malformed_attachment_is_refused(attachment: bytes | None) -> None:
    body, _ = seal_telemetry(record(), ROBOT, [OPS.public_key])
    with pytest.raises(WireError, match="attachment"):
        open_telemetry(telemetry_key("robot-7"), body, attachment, OPS)


def test_an_oversized_body_is_refused_before_its_signature_is_checked() -> None:
    with pytest.raises(WireError, match="exceeds"):
        telemetry_signer(telemetry_key("robot-7"), 100_000, bytes(96))


@pytest.mark.parametrize("field", ["rtt_ms_p50", "period_ms", "tick_lateness_ms_p99"])
def test_a_non_finite_latency_does_not_decode(field: str) -> None:
    plain = msgspec.msgpack.encode({**msgspec.structs.asdict(record()), field: math.inf})
    with pytest.raises(msgspec.ValidationError, match="not finite"):
        msgspec.msgpack.decode(plain, type=EdgeTelemetry)


def test_a_record_of_an_active_robot_is_small() -> None:
    """About once a second per robot: about 1 kB/s with one reader; each further reader's copy adds the record
    and 130 bytes (its key id, an X25519 key, the cipher's attachment)."""
    busy = record(
        chunks_rejected={"mac": 3, "stale_seq": 1},
        transitions=[Transition("reconnecting", "server liveliness lost" * 4, 900.0)] * 4,
        rtt_ms_p50=10.0,
        rtt_ms_p99=30.0,
        codec="jpeg90",
    )
    body, attachment = seal_telemetry(busy, ROBOT, [OPS.public_key])
    assert len(body) + len(attachment) < 1100
    two, _ = seal_telemetry(busy, ROBOT, [OPS.public_key, OTHER_OPS.public_key])
    assert len(two) - len(body) < len(encode(busy)) + 130
