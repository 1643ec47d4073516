"""Edge telemetry on the wire: the key, the signature (checked before decoding) and the bounds."""

from __future__ import annotations

import math

import msgspec
import pytest
import zenoh

from servo._core import ServerIdentity
from servo.wire import TELEMETRY_SELECTOR, EdgeTelemetry, Transition, WireError, open_telemetry, seal_telemetry
from servo.wire.telemetry import client_of_telemetry, signed_bytes, telemetry_key

ROBOT = ServerIdentity.from_seed(bytes(range(32)))


def record(client_id: str = "robot-7", **changes: object) -> EdgeTelemetry:
    base = EdgeTelemetry(
        client_id, b"bootboot", 1, 1000.0, "streaming", replica="r0", last_transition=Transition("streaming", "x", 1.0)
    )
    return msgspec.structs.replace(base, **changes)


def test_a_signed_record_opens_with_the_signers_key() -> None:
    body, attachment = seal_telemetry(record(), ROBOT)
    key, opened = open_telemetry(telemetry_key("robot-7"), body, attachment)
    assert key == ROBOT.public_key
    assert opened == record()


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
    body, attachment = seal_telemetry(record(), ROBOT)
    tampered = bytearray(body)
    tampered[at] ^= 0x01
    with pytest.raises(WireError, match="signature"):
        open_telemetry(telemetry_key("robot-7"), bytes(tampered), attachment)


def test_a_record_replayed_on_another_robots_key_is_refused() -> None:
    body, attachment = seal_telemetry(record("robot-7"), ROBOT)
    with pytest.raises(WireError, match="signature"):
        open_telemetry(telemetry_key("robot-8"), body, attachment)


def test_a_signed_record_naming_another_robot_is_refused() -> None:
    # Signed honestly for robot-8's key, but claiming to be robot-7 inside.
    forged = msgspec.msgpack.encode(record("robot-7"))
    attachment = ROBOT.public_key + ROBOT.sign(signed_bytes("robot-8", forged))
    with pytest.raises(WireError, match="names client"):
        open_telemetry(telemetry_key("robot-8"), forged, attachment)


@pytest.mark.parametrize("attachment", [None, b"", bytes(95), bytes(97)])
def test_a_missing_or_malformed_attachment_is_refused(attachment: bytes | None) -> None:
    body, _ = seal_telemetry(record(), ROBOT)
    with pytest.raises(WireError, match="attachment"):
        open_telemetry(telemetry_key("robot-7"), body, attachment)


def test_an_oversized_body_is_refused_before_its_signature_is_checked() -> None:
    with pytest.raises(WireError, match="exceeds"):
        open_telemetry(telemetry_key("robot-7"), bytes(10_000), bytes(96))


@pytest.mark.parametrize("field", ["rtt_ms_p50", "period_ms", "tick_lateness_ms_p99"])
def test_a_non_finite_latency_does_not_decode(field: str) -> None:
    body = msgspec.msgpack.encode({**msgspec.structs.asdict(record()), field: math.inf})
    attachment = ROBOT.public_key + ROBOT.sign(signed_bytes("robot-7", body))
    with pytest.raises(WireError, match="not finite"):
        open_telemetry(telemetry_key("robot-7"), body, attachment)


def test_a_record_of_an_active_robot_is_small() -> None:
    """About once a second per robot: well under the 1 kB/s budget with the 96-byte attachment."""
    busy = record(
        chunks_rejected={"mac": 3, "stale_seq": 1},
        transitions=[Transition("reconnecting", "server liveliness lost" * 4, 900.0)] * 4,
        rtt_ms_p50=10.0,
        rtt_ms_p99=30.0,
        codec="jpeg90",
    )
    body, attachment = seal_telemetry(busy, ROBOT)
    assert len(body) + len(attachment) < 1000
