"""msgpack encode/decode of wire messages with size limits and readable errors."""

from __future__ import annotations

from typing import Any, TypeVar, overload

import msgspec

from servo.wire.errors import WireError

T = TypeVar("T")

#: Default ceiling for one message body (a few uncompressed 1080p frames fit comfortably).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

_encoder = msgspec.msgpack.Encoder()
_decoders: dict[Any, msgspec.msgpack.Decoder[Any]] = {}


def encode(message: msgspec.Struct) -> bytes:
    """Serialise a message body to msgpack."""
    return _encoder.encode(message)


def encode_into(message: msgspec.Struct, buffer: bytearray) -> None:
    """Serialise a message body into ``buffer``, which is resized to fit it (a sender reuses one buffer)."""
    _encoder.encode_into(message, buffer)


@overload
def decode(buf: bytes | memoryview, kind: type[T], *, max_bytes: int = MAX_MESSAGE_BYTES) -> T: ...


@overload
def decode(buf: bytes | memoryview, kind: Any, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Any: ...


def decode(buf: bytes | memoryview, kind: Any, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Any:
    """Deserialise ``buf`` as ``kind``; bytes fields become views into ``buf`` (no copy).

    ``kind`` is a Struct type, or a union of tagged Structs (typed by the caller's annotation).

    Every failure is a `WireError`, whatever the bytes: that is the contract every receiver
    relies on to turn hostile input into one counted, logged rejection.

    Raises:
        WireError: oversized, not msgpack, invalid UTF-8 in a string, or not a valid ``kind``
            (the message names the path of the offending field, e.g. ``$.state.shape[0]``).
    """
    name = getattr(kind, "__name__", str(kind))
    if len(buf) > max_bytes:
        raise WireError(f"{name} of {len(buf)} bytes exceeds the limit of {max_bytes}")
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.msgpack.Decoder(kind)
    try:
        return decoder.decode(buf)
    except msgspec.ValidationError as exc:
        raise WireError(f"invalid {name}: {exc}") from exc
    except msgspec.DecodeError as exc:
        if "UTF-8" in str(exc):  # msgspec >= 0.23 says it ("Invalid UTF-8 encoded string"): one servo wording
            raise WireError(f"malformed {name}: a string is not valid UTF-8") from None
        raise WireError(f"malformed {name}: {exc}") from exc
    except UnicodeDecodeError as exc:  # msgspec < 0.23 lets invalid UTF-8 in a str escape as this
        raise WireError(f"malformed {name}: a string is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
