"""CDR of the two image messages, with their pixels as one ``bytes``.

Cyclone's generic codec makes a Python int of every byte of a ``uint8[]``. A layout is a string
of field codes in declaration order, nested structs flattened (their fields inline): ``i`` int32,
``I`` uint32, ``B`` uint8, ``s`` string, ``b`` ``uint8[]``. These messages hold nothing wider than
4 bytes, so XCDR1 and XCDR2 (final structs) lay them out identically; only the encapsulation
header differs. Decoding treats the buffer as hostile: every length is checked against what is
left, strings must end in NUL and be UTF-8, and any violation is a `ValueError`.
"""

from __future__ import annotations

import struct
import sys
from typing import Any

from cyclonedds.idl._support import Endianness

#: ``sensor_msgs/Image``: header (stamp.sec, stamp.nanosec, frame_id), height, width, encoding,
#: is_bigendian, step, data.
IMAGE = "iIsIIsBIb"
#: ``sensor_msgs/CompressedImage``: header, format, data.
COMPRESSED_IMAGE = "iIssb"

# Encapsulation identifiers of final structs (DDS-XTypes 7.6.3.1.2): CDR_BE/LE, CDR2_BE/LE.
_XCDR1, _XCDR2 = 0x00, 0x06
_SIZE = {"i": 4, "I": 4, "B": 1}


def encode(values: list[Any], layout: str, *, endianness: Endianness | None, use_version_2: bool | None) -> bytes:
    """``values`` (one per field code) as CDR with its 4-byte encapsulation header."""
    little = (endianness or Endianness.native()) is Endianness.Little
    order = "<" if little else ">"
    head = (_XCDR2 if use_version_2 else _XCDR1) | little
    out = bytearray((0, head, 0, 0))
    for code, value in zip(layout, values, strict=True):
        if code in _SIZE:
            _pad(out, _SIZE[code])
            out += struct.pack(order + code, value)
        else:
            raw = value.encode("utf-8") + b"\0" if code == "s" else bytes(value)
            _pad(out, 4)
            out += struct.pack(order + "I", len(raw))
            out += raw
    return bytes(out)


def _pad(out: bytearray, size: int) -> None:
    # Alignment counts from the end of the encapsulation header.
    out += bytes(-(len(out) - 4) % size)


def decode(data: bytes, layout: str, *, has_header: bool, use_version_2: bool | None) -> list[Any]:
    """The field values of a CDR buffer (with its encapsulation header unless ``has_header`` is False).

    Raises:
        ValueError: an unknown encapsulation, a truncated buffer, a string without its NUL or not
            UTF-8.
    """
    view = memoryview(data)
    if has_header:
        if len(view) < 4 or view[1] & ~1 not in (_XCDR1, _XCDR2) or view[0] != 0:
            raise ValueError(f"not a CDR buffer of a final struct (encapsulation {bytes(view[:2]).hex()})")
        order, base = ("<" if view[1] & 1 else ">"), 4
    else:
        order, base = ("<" if sys.byteorder == "little" else ">"), 0
    pos = base
    values: list[Any] = []
    for code in layout:
        size = _SIZE.get(code, 4)
        pos += -(pos - base) % size
        if pos + size > len(view):
            raise ValueError(f"CDR buffer of {len(view)} bytes ends inside field {len(values)}")
        (number,) = struct.unpack_from(order + (code if code in _SIZE else "I"), view, pos)
        pos += size
        if code in _SIZE:
            values.append(number)
            continue
        if number > len(view) - pos:
            raise ValueError(f"field {len(values)} claims {number} bytes, {len(view) - pos} are left")
        raw = view[pos : pos + number]
        pos += number
        if code == "b":
            values.append(bytes(raw))
        elif number == 0 or raw[-1] != 0:
            raise ValueError(f"string field {len(values)} does not end in NUL")
        else:
            values.append(bytes(raw[:-1]).decode("utf-8"))
    return values
