from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servo.robots.feetech import (
    STS3215,
    FeetechBus,
    FeetechChecksumError,
    FeetechError,
    FeetechProtocolError,
    FeetechStatusError,
    FeetechTimeoutError,
    Instruction,
    Register,
    checksum,
    decode_sign_magnitude,
    decode_status,
    encode_packet,
    encode_sign_magnitude,
)
from tests.robots.feetech_emulator import FeetechEmulator

IDS = [1, 2, 3, 4, 5, 6]


@pytest.fixture
def bus(emulator: FeetechEmulator) -> Iterator[FeetechBus]:
    with FeetechBus(emulator.port, timeout_s=0.03, retries=2) as bus:
        yield bus


# Golden packets worked out by hand from the protocol: CHK = ~(ID + LEN + INSTR + params) & 0xFF.
def test_ping_packet_golden_bytes() -> None:
    # 01 + 02 + 01 = 0x04 -> ~0x04 = 0xFB
    assert encode_packet(1, Instruction.PING) == bytes.fromhex("ff ff 01 02 01 fb")


def test_read_packet_golden_bytes() -> None:
    # READ Present_Position (0x38) of 2 bytes from motor 1: 01+04+02+38+02 = 0x41 -> 0xBE
    params = bytes((STS3215.PRESENT_POSITION.address, 2))
    assert encode_packet(1, Instruction.READ, params) == bytes.fromhex("ff ff 01 04 02 38 02 be")


def test_sync_write_packet_golden_bytes(emulator: FeetechEmulator, bus: FeetechBus) -> None:
    # Goal_Position (0x2A, 2 bytes): motor 1 <- 2048 (00 08), motor 2 <- 1024 (00 04).
    # FE+0A+83+2A+02+01+00+08+02+00+04 = 454 = 0x1C6 -> ~0xC6 = 0x39
    expected = bytes.fromhex("ff ff fe 0a 83 2a 02 01 00 08 02 00 04 39")
    params = bytes.fromhex("2a 02 01 00 08 02 00 04")
    assert encode_packet(0xFE, Instruction.SYNC_WRITE, params) == expected
    # The bus builds exactly that packet, and the servos take it.
    bus.sync_write(STS3215.GOAL_POSITION, {1: 2048, 2: 1024})
    assert emulator.wait_for(lambda: emulator.get(2, 42) == 1024)
    assert emulator.get(1, 42) == 2048


def test_sync_read_packet_golden_bytes() -> None:
    # FE+0A+82+38+02+(1+2+3+4+5+6) = 473 = 0x1D9 -> ~0xD9 = 0x26
    params = bytes((0x38, 2, *IDS))
    assert encode_packet(0xFE, Instruction.SYNC_READ, params) == bytes.fromhex(
        "ff ff fe 0a 82 38 02 01 02 03 04 05 06 26"
    )


def test_status_packet_decodes() -> None:
    status = decode_status(bytes.fromhex("ff ff 01 04 00 00 08 f2"))
    assert (status.motor_id, status.error, status.params) == (1, 0, b"\x00\x08")


def test_status_packet_with_bad_checksum_is_rejected() -> None:
    with pytest.raises(FeetechChecksumError, match="bad checksum"):
        decode_status(bytes.fromhex("ff ff 01 04 00 00 08 f3"))


def test_status_packet_with_wrong_length_is_rejected() -> None:
    with pytest.raises(FeetechProtocolError):
        decode_status(bytes.fromhex("ff ff 01 05 00 00 08 f2"))


@given(st.binary(min_size=0, max_size=20), st.integers(0, 0xFD), st.integers(0, 255))
def test_packets_round_trip(params: bytes, motor_id: int, code: int) -> None:
    status = decode_status(encode_packet(motor_id, code, params))
    assert (status.motor_id, status.error, status.params) == (motor_id, code, params)


def test_checksum_matches_definition() -> None:
    assert checksum(bytes((1, 2, 0))) == 0xFC


@pytest.mark.parametrize(
    ("value", "bit", "raw"),
    [(0, 15, 0), (100, 15, 100), (-5, 15, 0x8005), (-100, 11, 0x864), (2047, 11, 2047)],
)
def test_sign_magnitude(value: int, bit: int, raw: int) -> None:
    assert encode_sign_magnitude(value, bit) == raw
    assert decode_sign_magnitude(raw, bit) == value


def test_sign_magnitude_rejects_overflow() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        encode_sign_magnitude(2048, 11)


def test_register_encoding_is_little_endian_and_signed() -> None:
    assert STS3215.GOAL_POSITION.encode(0x0123) == b"\x23\x01"
    assert STS3215.HOMING_OFFSET.encode(-1) == b"\x01\x08"
    assert STS3215.HOMING_OFFSET.decode(b"\x01\x08") == -1
    with pytest.raises(ValueError, match="Lock"):
        Register("Lock", 55, 1).encode(256)


def test_ping_and_model_number(bus: FeetechBus) -> None:
    assert all(bus.ping(i) for i in IDS)
    assert bus.read(3, STS3215.MODEL_NUMBER) == 777


def test_ping_of_absent_motor_is_false(emulator: FeetechEmulator, bus: FeetechBus) -> None:
    emulator.configure(missing_ids={4})
    assert bus.ping(3)
    assert not bus.ping(4)


def test_write_then_read(bus: FeetechBus) -> None:
    bus.write(2, STS3215.HOMING_OFFSET, -300)
    assert bus.read(2, STS3215.HOMING_OFFSET) == -300


def test_sync_read_of_six_motors(emulator: FeetechEmulator, bus: FeetechBus) -> None:
    for motor_id in IDS:
        emulator.set(motor_id, 56, 1000 + 100 * motor_id)
    emulator.set(6, 56, 0x8000 | 7)  # sign-magnitude -7
    values = bus.sync_read(STS3215.PRESENT_POSITION, IDS)
    assert values == {1: 1100, 2: 1200, 3: 1300, 4: 1400, 5: 1500, 6: -7}
    assert list(values) == IDS


def test_timeout_is_a_clear_error(emulator: FeetechEmulator, bus: FeetechBus) -> None:
    emulator.configure(missing_ids={5})
    with pytest.raises(FeetechTimeoutError, match=r"no reply from motor 5 within 30 ms") as info:
        bus.read(5, STS3215.PRESENT_POSITION)
    message = str(info.value)
    assert "3 attempt(s)" in message
    assert emulator.port in message


def test_dropped_reply_is_retried(emulator: FeetechEmulator, bus: FeetechBus) -> None:
    emulator.configure(drop_replies=2)
    assert bus.read(1, STS3215.MODEL_NUMBER) == 777


def test_corrupted_reply_is_retried_then_reported(emulator: FeetechEmulator, bus: FeetechBus) -> None:
    emulator.configure(corrupt_replies=1)
    assert bus.read(1, STS3215.MODEL_NUMBER) == 777
    emulator.configure(corrupt_replies=3)
    with pytest.raises(FeetechChecksumError, match="bad checksum"):
        bus.read(1, STS3215.MODEL_NUMBER)


def test_sync_read_names_the_silent_motor(emulator: FeetechEmulator, bus: FeetechBus) -> None:
    emulator.configure(missing_ids={3})
    with pytest.raises(FeetechProtocolError, match="expected a reply from motor 3"):
        bus.sync_read(STS3215.PRESENT_POSITION, IDS)


def test_sync_read_of_last_silent_motor_times_out(emulator: FeetechEmulator, bus: FeetechBus) -> None:
    emulator.configure(missing_ids={6})
    with pytest.raises(FeetechTimeoutError, match="motor 6"):
        bus.sync_read(STS3215.PRESENT_POSITION, IDS)


def test_servo_error_status(emulator: FeetechEmulator, bus: FeetechBus) -> None:
    emulator.configure(error_bits={2: 0x20})
    with pytest.raises(FeetechStatusError, match=r"motor 2 reported error 0x20 \(overload\)") as info:
        bus.read(2, STS3215.PRESENT_POSITION)
    assert (info.value.motor_id, info.value.error) == (2, 0x20)
    # The control loop can opt out and look at the bits instead.
    values = bus.sync_read(STS3215.PRESENT_POSITION, IDS, check_status=False)
    assert len(values) == 6
    assert bus.last_status_errors == {2: 0x20}
    with pytest.raises(FeetechStatusError):
        bus.sync_read(STS3215.PRESENT_POSITION, IDS)


def test_closed_bus_and_bad_port_errors() -> None:
    bus = FeetechBus("/dev/does-not-exist-servo")
    with pytest.raises(FeetechError, match="not open"):
        bus.ping(1)
    with pytest.raises(FeetechError, match="cannot open serial port '/dev/does-not-exist-servo'"):
        bus.open()
    assert not bus.is_open


def test_invalid_ids_are_rejected(bus: FeetechBus) -> None:
    with pytest.raises(ValueError, match="outside"):
        bus.read(254, STS3215.PRESENT_POSITION)
    with pytest.raises(ValueError, match="duplicate"):
        bus.sync_read(STS3215.PRESENT_POSITION, [1, 1])
