"""Feetech STS/SCS protocol 0 packets, errors and the STS3215 control table.

Instruction packet ``FF FF ID LEN INSTR PARAMS... CHK`` and status packet
``FF FF ID LEN ERR PARAMS... CHK``, where ``LEN = len(PARAMS) + 2`` and
``CHK = ~(ID + LEN + INSTR/ERR + sum(PARAMS)) & 0xFF``. Multi-byte registers are little-endian
(STS series). Some registers hold sign-magnitude values (LeRobot's ``encoding_utils``): the
homing offset has its sign in bit 11, goal and present position in bit 15.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from servo.errors import RobotError

HEADER: Final = b"\xff\xff"
BROADCAST_ID: Final = 0xFE
MAX_ID: Final = 0xFD
_MAX_PARAMS: Final = 0xFF - 2


class Instruction(IntEnum):
    """Protocol 0 instruction codes."""

    PING = 0x01
    READ = 0x02
    WRITE = 0x03
    SYNC_READ = 0x82
    SYNC_WRITE = 0x83


_ERROR_BITS: Final = {
    0x01: "input voltage",
    0x02: "angle sensor",
    0x04: "overheat",
    0x08: "over-current",
    0x20: "overload",
}


def describe_status_error(error: int) -> str:
    """Human-readable names of the bits set in a status packet's error byte."""
    names = [name for bit, name in _ERROR_BITS.items() if error & bit]
    unknown = error & ~sum(_ERROR_BITS)
    if unknown:
        names.append(f"unknown bits 0x{unknown:02x}")
    return ", ".join(names) or "none"


@dataclass(frozen=True)
class Register:
    """A control-table entry: address, size in bytes and, if signed, its sign bit. Immutable."""

    name: str
    address: int
    size: int
    sign_bit: int | None = None

    def encode(self, value: int) -> bytes:
        """Raw little-endian bytes for ``value`` (sign-magnitude if the register is signed)."""
        raw = value if self.sign_bit is None else encode_sign_magnitude(value, self.sign_bit)
        if not 0 <= raw < 1 << (8 * self.size):
            raise ValueError(f"{self.name}: value {value} does not fit in {self.size} byte(s)")
        return raw.to_bytes(self.size, "little")

    def decode(self, data: bytes) -> int:
        """Value of the register's raw little-endian bytes."""
        raw = int.from_bytes(data, "little")
        return raw if self.sign_bit is None else decode_sign_magnitude(raw, self.sign_bit)


class STS3215:
    """STS3215 control-table entries the SO-100 driver uses (LeRobot's tables.py); constants."""

    MODEL = 777
    RESOLUTION = 4096

    MODEL_NUMBER = Register("Model_Number", 3, 2)
    RETURN_DELAY_TIME = Register("Return_Delay_Time", 7, 1)
    MIN_POSITION_LIMIT = Register("Min_Position_Limit", 9, 2)
    MAX_POSITION_LIMIT = Register("Max_Position_Limit", 11, 2)
    MAX_TORQUE_LIMIT = Register("Max_Torque_Limit", 16, 2)
    PHASE = Register("Phase", 18, 1)
    P_COEFFICIENT = Register("P_Coefficient", 21, 1)
    D_COEFFICIENT = Register("D_Coefficient", 22, 1)
    I_COEFFICIENT = Register("I_Coefficient", 23, 1)
    PROTECTION_CURRENT = Register("Protection_Current", 28, 2)
    HOMING_OFFSET = Register("Homing_Offset", 31, 2, sign_bit=11)
    OPERATING_MODE = Register("Operating_Mode", 33, 1)
    OVERLOAD_TORQUE = Register("Overload_Torque", 36, 1)
    TORQUE_ENABLE = Register("Torque_Enable", 40, 1)
    ACCELERATION = Register("Acceleration", 41, 1)
    GOAL_POSITION = Register("Goal_Position", 42, 2, sign_bit=15)
    LOCK = Register("Lock", 55, 1)
    PRESENT_POSITION = Register("Present_Position", 56, 2, sign_bit=15)
    MAXIMUM_ACCELERATION = Register("Maximum_Acceleration", 85, 1)


def encode_sign_magnitude(value: int, sign_bit: int) -> int:
    """Sign-magnitude encoding: ``|value|`` in the low bits, the sign in bit ``sign_bit``."""
    magnitude = abs(value)
    if magnitude >= 1 << sign_bit:
        raise ValueError(f"magnitude {magnitude} does not fit below sign bit {sign_bit}")
    return (1 << sign_bit | magnitude) if value < 0 else magnitude


def decode_sign_magnitude(raw: int, sign_bit: int) -> int:
    """Inverse of `encode_sign_magnitude`."""
    magnitude = raw & ((1 << sign_bit) - 1)
    return -magnitude if raw >> sign_bit & 1 else magnitude


def checksum(body: bytes) -> int:
    """Protocol 0 checksum of everything after the header: ``~sum & 0xFF``."""
    return ~sum(body) & 0xFF


def encode_packet(motor_id: int, code: int, params: bytes = b"") -> bytes:
    """Frame an instruction (or, with ``code`` = error byte, a status) packet."""
    if not 0 <= motor_id <= BROADCAST_ID:
        raise ValueError(f"motor id {motor_id} outside 0..{BROADCAST_ID}")
    if len(params) > _MAX_PARAMS:
        raise ValueError(f"{len(params)} parameter bytes exceed the packet limit {_MAX_PARAMS}")
    body = bytes((motor_id, len(params) + 2, code)) + params
    return HEADER + body + bytes((checksum(body),))


@dataclass(frozen=True)
class StatusPacket:
    """A decoded status packet. Immutable."""

    motor_id: int
    error: int
    params: bytes


def decode_status(packet: bytes) -> StatusPacket:
    """Validate and decode one complete status packet.

    Raises:
        FeetechProtocolError: Bad header or length.
        FeetechChecksumError: Checksum mismatch.
    """
    if len(packet) < 6 or packet[:2] != HEADER:
        raise FeetechProtocolError(f"malformed status packet {packet.hex(' ')}")
    if packet[3] != len(packet) - 4:
        raise FeetechProtocolError(f"status packet length byte disagrees: {packet.hex(' ')}")
    expected = checksum(packet[2:-1])
    if packet[-1] != expected:
        raise FeetechChecksumError(f"bad checksum 0x{packet[-1]:02x} (expected 0x{expected:02x}) in {packet.hex(' ')}")
    return StatusPacket(motor_id=packet[2], error=packet[4], params=bytes(packet[5:-1]))


class FeetechError(RobotError):
    """Base class of bus errors."""


class FeetechTimeoutError(FeetechError, TimeoutError):
    """A motor did not answer in time."""


class FeetechChecksumError(FeetechError):
    """A reply was corrupted."""


class FeetechProtocolError(FeetechError):
    """A reply was malformed or came from the wrong motor."""


class FeetechStatusError(FeetechError):
    """A motor answered with its error byte set (a hardware fault such as overload)."""

    def __init__(self, message: str, motor_id: int, error: int) -> None:
        super().__init__(message)
        self.motor_id = motor_id
        self.error = error
