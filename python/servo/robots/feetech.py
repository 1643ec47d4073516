"""Feetech STS/SCS serial bus over pyserial, protocol 0 (what the SO-100's STS3215 speaks).

The packet format, errors and control table live in `servo.robots.feetech_codec` and are
re-exported here, so ``from servo.robots.feetech import ...`` reaches all of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Final, Protocol, Self

import serial

from servo.logs import get_logger

from .feetech_codec import (
    BROADCAST_ID,
    HEADER,
    MAX_ID,
    STS3215,
    FeetechChecksumError,
    FeetechError,
    FeetechProtocolError,
    FeetechStatusError,
    FeetechTimeoutError,
    Instruction,
    Register,
    StatusPacket,
    checksum,
    decode_sign_magnitude,
    decode_status,
    describe_status_error,
    encode_packet,
    encode_sign_magnitude,
)

__all__ = [
    "BROADCAST_ID",
    "HEADER",
    "MAX_ID",
    "STS3215",
    "FeetechBus",
    "FeetechChecksumError",
    "FeetechError",
    "FeetechProtocolError",
    "FeetechStatusError",
    "FeetechTimeoutError",
    "Instruction",
    "Register",
    "StatusPacket",
    "checksum",
    "decode_sign_magnitude",
    "decode_status",
    "describe_status_error",
    "encode_packet",
    "encode_sign_magnitude",
]

_log = get_logger(__name__)

# Bytes skipped while hunting for a header before the reply is declared garbage.
_MAX_NOISE: Final = 64
# Read size while draining a failed exchange (each read returns after one timeout of silence).
_DRAIN_CHUNK: Final = 256


class _Port(Protocol):
    # The slice of pyserial's Serial that the bus uses.
    def write(self, data: bytes) -> int | None: ...
    def read(self, size: int) -> bytes: ...
    def reset_input_buffer(self) -> None: ...
    def close(self) -> None: ...


_RETRYABLE = (FeetechTimeoutError, FeetechChecksumError, FeetechProtocolError)


class FeetechBus:
    """A Feetech protocol 0 bus on one serial port.

    Owned by one thread (the control-loop thread, or whoever connects the robot); it is not
    thread-safe, since requests and replies share one half-duplex line. Each exchange flushes
    stale input, sends one packet and reads the replies with the serial timeout; timeouts,
    corrupted and mismatched replies are retried ``retries`` times, servo error bits are not.
    """

    def __init__(self, port: str, baudrate: int = 1_000_000, timeout_s: float = 0.05, retries: int = 2) -> None:
        """Describe the bus; `open` opens the port.

        Args:
            port: Serial device, e.g. ``/dev/ttyACM0``.
            baudrate: Line rate; the STS3215 ships at 1 Mbaud.
            timeout_s: Longest wait for each reply packet.
            retries: Extra attempts after a timeout or a corrupted reply.
        """
        if retries < 0 or timeout_s <= 0:
            raise ValueError("retries must be >= 0 and timeout_s positive")
        self.port = port
        self.baudrate = baudrate
        self.timeout_s = timeout_s
        self.retries = retries
        self._serial: _Port | None = None
        self._last_status_errors: dict[int, int] = {}
        self._log = _log.bind(port=port)

    @property
    def is_open(self) -> bool:
        """Whether the port is open."""
        return self._serial is not None

    @property
    def last_status_errors(self) -> Mapping[int, int]:
        """Error bytes reported in the last `sync_read`, for the motors that set any bit."""
        return self._last_status_errors

    def open(self) -> None:
        """Open the serial port. Idempotent.

        Raises:
            FeetechError: The port cannot be opened (wrong path, permissions, in use).
        """
        if self._serial is not None:
            return
        try:
            self._serial = serial.Serial(self.port, self.baudrate, timeout=self.timeout_s)
        except (serial.SerialException, OSError) as exc:
            raise FeetechError(f"cannot open serial port {self.port!r}: {exc}") from exc
        self._log.debug("bus opened", baudrate=self.baudrate)

    def close(self) -> None:
        """Close the serial port. Idempotent."""
        if self._serial is not None:
            self._serial.close()
            self._serial = None
            self._log.debug("bus closed")

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def ping(self, motor_id: int) -> bool:
        """Whether motor ``motor_id`` answers a ping (error bits are logged, not raised)."""
        try:
            status = self._exchange(motor_id, Instruction.PING, b"", 0, "ping")
        except FeetechTimeoutError:
            return False
        if status.error:
            self._log.warning(
                "motor reports an error",
                motor_id=motor_id,
                error=describe_status_error(status.error),
            )
        return True

    def read(self, motor_id: int, register: Register) -> int:
        """Read one register of one motor."""
        status = self._exchange(
            motor_id,
            Instruction.READ,
            bytes((register.address, register.size)),
            register.size,
            f"read {register.name}",
        )
        self._check_status(status, f"read {register.name}")
        return register.decode(status.params)

    def write(self, motor_id: int, register: Register, value: int) -> None:
        """Write one register of one motor and wait for its acknowledgement."""
        params = bytes((register.address,)) + register.encode(value)
        status = self._exchange(motor_id, Instruction.WRITE, params, 0, f"write {register.name}")
        self._check_status(status, f"write {register.name}")

    def sync_read(self, register: Register, motor_ids: Sequence[int], *, check_status: bool = True) -> dict[int, int]:
        """Read one register of several motors with a single request.

        Args:
            register: Register to read.
            motor_ids: Motors to read, in the order they will answer.
            check_status: Raise `FeetechStatusError` when a motor reports an error bit; with
                ``False`` the bits are kept in `last_status_errors` instead.

        Returns:
            Motor id -> value.
        """
        ids = _check_ids(motor_ids)
        request = encode_packet(
            BROADCAST_ID,
            Instruction.SYNC_READ,
            bytes((register.address, register.size, *ids)),
        )
        what = f"sync_read {register.name}"
        for attempt in range(self.retries + 1):
            self._send(request)
            try:
                replies = [self._receive(mid, register.size, what) for mid in ids]
            except _RETRYABLE as exc:
                self._retry_or_raise(exc, attempt, what)
                continue
            self._last_status_errors = {s.motor_id: s.error for s in replies if s.error}
            if check_status:
                for status in replies:
                    self._check_status(status, what)
            return {s.motor_id: register.decode(s.params) for s in replies}
        raise AssertionError("unreachable")

    def sync_write(self, register: Register, values: Mapping[int, int]) -> None:
        """Write one register of several motors with a single, unacknowledged packet."""
        params = bytearray((register.address, register.size))
        for motor_id, value in zip(_check_ids(values), values.values(), strict=True):
            params.append(motor_id)
            params += register.encode(value)
        self._send(encode_packet(BROADCAST_ID, Instruction.SYNC_WRITE, bytes(params)))

    def _exchange(
        self, motor_id: int, instruction: Instruction, params: bytes, reply_size: int, what: str
    ) -> StatusPacket:
        _check_ids((motor_id,))
        request = encode_packet(motor_id, instruction, params)
        for attempt in range(self.retries + 1):
            self._send(request)
            try:
                return self._receive(motor_id, reply_size, what)
            except _RETRYABLE as exc:
                self._retry_or_raise(exc, attempt, what)
        raise AssertionError("unreachable")

    def _retry_or_raise(self, exc: FeetechError, attempt: int, what: str) -> None:
        if attempt < self.retries:
            self._log.debug("retrying", op=what, attempt=attempt + 1, error=str(exc))
            self._drain()
            return
        attempts = self.retries + 1
        raise type(exc)(f"{exc} ({what}, {attempts} attempt(s), port {self.port})") from exc

    def _drain(self) -> None:
        # Replies of a failed exchange may still be arriving (a sync read fails at the first
        # wrong id while later motors keep answering); wait until the line is quiet for one
        # timeout so the retry cannot read them as its own.
        port = self._port()
        while port.read(_DRAIN_CHUNK):
            pass

    def _send(self, packet: bytes) -> None:
        port = self._port()
        # A reply that arrived after an earlier timeout must not be taken for this one's.
        port.reset_input_buffer()
        port.write(packet)

    def _receive(self, motor_id: int, size: int, what: str) -> StatusPacket:
        status = decode_status(self._read_packet(motor_id))
        if status.motor_id != motor_id:
            raise FeetechProtocolError(
                f"expected a reply from motor {motor_id} but motor {status.motor_id} answered "
                f"(is motor {motor_id} missing?)"
            )
        if len(status.params) != size:
            raise FeetechProtocolError(
                f"motor {motor_id} replied with {len(status.params)} data byte(s), expected {size}"
            )
        return status

    def _read_packet(self, motor_id: int) -> bytes:
        buf = bytearray(self._read_exact(4, motor_id))
        skipped = 0
        # Resynchronise on FF FF followed by a real id (an extra FF is line noise).
        while not (buf[0] == 0xFF and buf[1] == 0xFF and buf[2] != 0xFF):
            del buf[0]
            skipped += 1
            if skipped > _MAX_NOISE:
                raise FeetechProtocolError(f"no packet header in {skipped} bytes from the bus")
            buf += self._read_exact(1, motor_id)
        length = buf[3]
        if length < 2:
            raise FeetechProtocolError(f"status packet with impossible length {length}")
        return bytes(buf) + self._read_exact(length, motor_id)

    def _read_exact(self, size: int, motor_id: int) -> bytes:
        data: bytes = self._port().read(size)
        if len(data) < size:
            raise FeetechTimeoutError(
                f"no reply from motor {motor_id} within {self.timeout_s * 1e3:.0f} ms"
                + (f" (got {len(data)} of {size} bytes)" if data else "")
            )
        return data

    def _check_status(self, status: StatusPacket, what: str) -> None:
        if status.error:
            raise FeetechStatusError(
                f"motor {status.motor_id} reported error 0x{status.error:02x} "
                f"({describe_status_error(status.error)}) during {what}",
                status.motor_id,
                status.error,
            )

    def _port(self) -> _Port:
        if self._serial is None:
            raise FeetechError(f"bus on {self.port!r} is not open")
        return self._serial


def _check_ids(motor_ids: Iterable[int]) -> list[int]:
    ids = list(motor_ids)
    bad = [i for i in ids if not 0 <= i <= MAX_ID]
    if bad:
        raise ValueError(f"motor ids {bad} outside 0..{MAX_ID}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate motor ids in {ids}")
    return ids
