"""CDR for the messages on the hot paths: JointState (every tick, both ways) and the two images.

Cyclone's generic Python codec walks a message field by field and element by element: ~60 µs per
JointState, and a Python int per byte of an image. These layouts decode and encode the same bytes
in a few struct calls (`tests/robots/ros2/test_messages.py` checks them against rosbags).

A layout is a string of field codes in declaration order, nested structs flattened (their fields
inline): ``i`` int32, ``I`` uint32, ``B`` uint8, ``s`` string, ``b`` ``uint8[]`` (as ``bytes``), ``S``
``string[]``, ``D`` ``float64[]``. XCDR1 and XCDR2 lay such final structs out alike but for the
encapsulation header, the alignment of 8-byte values (8 and 4) and the length (DHEADER) that
XCDR2 puts before a sequence of strings. Decoding treats the buffer as
hostile: every length is checked against what is left, strings must end in NUL and be UTF-8, and
any violation is a `ValueError`.
"""

from __future__ import annotations

import struct
import sys
from typing import Any

import numpy as np
from cyclonedds.idl._support import Endianness

#: ``std_msgs/Header``: stamp.sec, stamp.nanosec, frame_id.
_HEADER = "iIs"
#: ``sensor_msgs/JointState``: header, name, position, velocity, effort.
JOINT_STATE = _HEADER + "SDDD"
#: ``sensor_msgs/Image``: header, height, width, encoding, is_bigendian, step, data.
IMAGE = _HEADER + "IIsBIb"
#: ``sensor_msgs/CompressedImage``: header, format, data.
COMPRESSED_IMAGE = _HEADER + "sb"

# Encapsulation identifiers of final structs (DDS-XTypes 7.6.3.1.2): CDR_BE/LE, CDR2_BE/LE.
_XCDR1, _XCDR2 = 0x00, 0x06
_SIZE = {"i": 4, "I": 4, "B": 1}


def encode(values: list[Any], layout: str, *, endianness: Endianness | None, use_version_2: bool | None) -> bytes:
    """``values`` (one per field code) as CDR with its 4-byte encapsulation header."""
    little = (endianness or Endianness.native()) is Endianness.Little
    order = "<" if little else ">"
    out = bytearray((0, (_XCDR2 if use_version_2 else _XCDR1) | little, 0, 0))
    double_align = 4 if use_version_2 else 8
    for code, value in zip(layout, values, strict=True):
        if code in _SIZE:
            _pad(out, _SIZE[code])
            out += struct.pack(order + code, value)
        elif code == "D":
            _pad(out, 4)
            out += struct.pack(order + "I", len(value))
            if len(value):
                _pad(out, double_align)
                out += np.asarray(value, dtype=order + "f8").tobytes()
        elif code == "S":
            _pad(out, 4)
            if use_version_2:
                out += bytes(4)  # DHEADER, filled in below
            start = len(out)
            out += struct.pack(order + "I", len(value))
            for text in value:
                _string(out, order, text)
            if use_version_2:
                struct.pack_into(order + "I", out, start - 4, len(out) - start)
        elif code == "s":
            _string(out, order, value)
        else:
            _pad(out, 4)
            out += struct.pack(order + "I", len(value))
            out += value
    return bytes(out)


def _string(out: bytearray, order: str, text: str) -> None:
    raw = text.encode("utf-8") + b"\0"
    _pad(out, 4)
    out += struct.pack(order + "I", len(raw))
    out += raw


def _pad(out: bytearray, size: int) -> None:
    # Alignment counts from the end of the encapsulation header.
    out += bytes(-(len(out) - 4) % size)


class _Buffer:
    """A read cursor over one CDR buffer; every read is bounds-checked."""

    def __init__(self, view: memoryview, order: str, base: int, version_2: bool) -> None:
        self.view, self.order, self.base, self.pos = view, order, base, base
        self.version_2 = version_2
        self.double_align = 4 if version_2 else 8

    def align(self, size: int) -> None:
        self.pos += -(self.pos - self.base) % size

    def number(self, code: str) -> Any:
        size = _SIZE.get(code, 4)
        self.align(size)
        if self.pos + size > len(self.view):
            raise ValueError(f"CDR buffer of {len(self.view)} bytes ends at offset {self.pos}")
        (value,) = struct.unpack_from(self.order + code, self.view, self.pos)
        self.pos += size
        return value

    def require(self, size: int) -> None:
        left = len(self.view) - self.pos
        if size > left:
            raise ValueError(f"a field claims {size} bytes at offset {self.pos}, {left} are left")

    def raw(self, count: int, size: int = 1) -> memoryview:
        self.require(count * size)
        chunk = self.view[self.pos : self.pos + count * size]
        self.pos += count * size
        return chunk

    def string(self) -> str:
        raw = self.raw(self.number("I"))
        if not raw or raw[-1] != 0:
            raise ValueError(f"a string at offset {self.pos - len(raw)} does not end in NUL")
        return bytes(raw[:-1]).decode("utf-8")

    def doubles(self) -> list[float]:
        count = self.number("I")
        if not count:
            return []
        self.align(self.double_align)
        values: list[float] = np.frombuffer(self.raw(count, 8), dtype=self.order + "f8").tolist()
        return values


def decode(data: bytes, layout: str, *, has_header: bool, use_version_2: bool | None) -> list[Any]:
    """The field values of a CDR buffer (with its encapsulation header unless ``has_header`` is False).

    Raises:
        ValueError: an unknown encapsulation, a truncated buffer, a string without its NUL or not
            UTF-8.
    """
    view = memoryview(data)
    if has_header:
        if len(view) < 4 or view[0] != 0 or view[1] & ~1 not in (_XCDR1, _XCDR2):
            raise ValueError(f"not a CDR buffer of a final struct (encapsulation {bytes(view[:2]).hex()})")
        buffer = _Buffer(view, "<" if view[1] & 1 else ">", 4, view[1] & ~1 == _XCDR2)
    else:
        buffer = _Buffer(view, "<" if sys.byteorder == "little" else ">", 0, bool(use_version_2))
    values: list[Any] = []
    for code in layout:
        if code in _SIZE:
            values.append(buffer.number(code))
        elif code == "s":
            values.append(buffer.string())
        elif code == "b":
            values.append(bytes(buffer.raw(buffer.number("I"))))
        elif code == "S":
            if buffer.version_2:
                buffer.require(buffer.number("I"))  # the DHEADER
            values.append([buffer.string() for _ in range(buffer.number("I"))])
        else:
            values.append(buffer.doubles())
    return values
