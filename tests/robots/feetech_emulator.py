"""An emulated Feetech STS3215 bus on a pseudo-terminal, for tests without hardware.

The driver opens `FeetechEmulator.port` with pyserial like a real USB adapter; a thread on the
master side of the pty parses instruction packets and answers from a register file per motor.
The packet parsing here is written independently of `servo.robots.feetech`, so a symmetric bug
in encoder and decoder cannot hide.
"""

from __future__ import annotations

import os
import select
import threading
import tty
from collections.abc import Callable, Iterable

PING, READ, WRITE, SYNC_READ, SYNC_WRITE = 0x01, 0x02, 0x03, 0x82, 0x83
BROADCAST = 0xFE
MODEL_STS3215 = 777

ADDR_MODEL = 3
ADDR_ID = 5
ADDR_MIN_LIMIT = 9
ADDR_MAX_LIMIT = 11
ADDR_HOMING_OFFSET = 31
ADDR_TORQUE_ENABLE = 40
ADDR_GOAL_POSITION = 42
ADDR_LOCK = 55
ADDR_PRESENT_POSITION = 56


def _checksum(body: bytes) -> int:
    total = 0
    for byte in body:
        total += byte
    return (~total) & 0xFF


class FeetechEmulator:
    """Six (or any number of) STS3215 servos answering on a pty.

    The serving thread owns the master side of the pty. Tests configure faults and inspect
    registers from their own thread; all shared state is guarded by one condition variable,
    which `wait_for` uses to wait for the server to catch up with unacknowledged writes.
    """

    def __init__(self, motor_ids: Iterable[int] = range(1, 7)) -> None:
        self._cond = threading.Condition()
        self.registers: dict[int, bytearray] = {}
        for motor_id in motor_ids:
            regs = bytearray(128)
            regs[ADDR_MODEL : ADDR_MODEL + 2] = MODEL_STS3215.to_bytes(2, "little")
            regs[ADDR_ID] = motor_id
            regs[ADDR_MAX_LIMIT : ADDR_MAX_LIMIT + 2] = (4095).to_bytes(2, "little")
            regs[ADDR_GOAL_POSITION : ADDR_GOAL_POSITION + 2] = (2048).to_bytes(2, "little")
            regs[ADDR_PRESENT_POSITION : ADDR_PRESENT_POSITION + 2] = (2048).to_bytes(2, "little")
            self.registers[motor_id] = regs
        # Fault injection, all guarded by _cond.
        self.missing_ids: set[int] = set()
        self.drop_replies = 0
        self.corrupt_replies = 0
        self.error_bits: dict[int, int] = {}
        # What the bus was told: (instruction, motor id, address, data) per write.
        self.writes: list[tuple[int, int, int, bytes]] = []
        self.packets_seen = 0
        self.bad_packets = 0
        self._master, self._slave = os.openpty()
        tty.setraw(self._slave)
        self.port = os.ttyname(self._slave)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="feetech-emulator", daemon=True)

    def start(self) -> FeetechEmulator:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        assert not self._thread.is_alive(), "emulator thread did not stop"
        os.close(self._master)
        os.close(self._slave)

    # Register access for tests (raw unsigned little-endian values).
    def get(self, motor_id: int, address: int, size: int = 2) -> int:
        with self._cond:
            return int.from_bytes(self.registers[motor_id][address : address + size], "little")

    def set(self, motor_id: int, address: int, value: int, size: int = 2) -> None:
        with self._cond:
            self.registers[motor_id][address : address + size] = value.to_bytes(size, "little")

    def configure(self, **faults: object) -> None:
        """Set fault-injection attributes under the lock, e.g. ``configure(drop_replies=1)``."""
        with self._cond:
            for name, value in faults.items():
                if not hasattr(self, name):
                    raise AttributeError(name)
                setattr(self, name, value)

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 1.0) -> bool:
        """Wait until ``predicate`` (evaluated under the lock) holds after some packet."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout_s)

    def _serve(self) -> None:
        buf = bytearray()
        while not self._stop.is_set():
            ready, _, _ = select.select([self._master], [], [], 0.02)
            if not ready:
                continue
            try:
                buf += os.read(self._master, 4096)
            except OSError:
                return
            self._parse(buf)

    def _parse(self, buf: bytearray) -> None:
        while True:
            start = buf.find(b"\xff\xff")
            if start < 0:
                del buf[:-1]
                return
            del buf[:start]
            if len(buf) < 4:
                return
            total = 4 + buf[3]
            if len(buf) < total:
                return
            packet = bytes(buf[:total])
            del buf[:total]
            with self._cond:
                self.packets_seen += 1
                if packet[-1] != _checksum(packet[2:-1]):
                    # A real servo stays silent on a corrupted instruction.
                    self.bad_packets += 1
                else:
                    self._handle(packet[2], packet[4], packet[5:-1])
                self._cond.notify_all()

    def _handle(self, motor_id: int, instruction: int, params: bytes) -> None:
        if instruction == PING:
            self._reply(motor_id, b"")
        elif instruction == READ:
            address, size = params[0], params[1]
            if self._present(motor_id):
                self._reply(motor_id, bytes(self.registers[motor_id][address : address + size]))
        elif instruction == WRITE:
            if self._present(motor_id):
                self._write(motor_id, params[0], params[1:])
                self._reply(motor_id, b"")
        elif instruction == SYNC_READ:
            address, size = params[0], params[1]
            for target in params[2:]:
                if self._present(target):
                    data = bytes(self.registers[target][address : address + size])
                    self._reply(target, data)
        elif instruction == SYNC_WRITE:
            address, size = params[0], params[1]
            body = params[2:]
            for offset in range(0, len(body), size + 1):
                target = body[offset]
                if self._present(target):
                    self._write(target, address, body[offset + 1 : offset + 1 + size])

    def _present(self, motor_id: int) -> bool:
        return motor_id in self.registers and motor_id not in self.missing_ids

    def _write(self, motor_id: int, address: int, data: bytes) -> None:
        regs = self.registers[motor_id]
        regs[address : address + len(data)] = data
        self.writes.append((WRITE, motor_id, address, bytes(data)))
        # Instant servo: with torque on, the horn is where the goal says.
        if address == ADDR_GOAL_POSITION and regs[ADDR_TORQUE_ENABLE]:
            regs[ADDR_PRESENT_POSITION : ADDR_PRESENT_POSITION + 2] = data[:2]

    def _reply(self, motor_id: int, data: bytes) -> None:
        if motor_id == BROADCAST or not self._present(motor_id):
            return
        if self.drop_replies:
            self.drop_replies -= 1
            return
        body = bytes([motor_id, len(data) + 2, self.error_bits.get(motor_id, 0)]) + data
        check = _checksum(body)
        if self.corrupt_replies:
            self.corrupt_replies -= 1
            check ^= 0x5A
        os.write(self._master, b"\xff\xff" + body + bytes([check]))
