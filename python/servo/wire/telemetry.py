"""Edge telemetry: the small status record each robot publishes about once a second.

A robot publishes on its own key, `telemetry_key` (``@servo/@robots/<client>/telemetry``). The
second chunk is verbatim, so no server's key (``@servo/<app>/…``, whose segments never start
with ``@``) can collide with it, and no wildcard over servers (``@servo/*/*/*/…``) reaches it;
a router's access control lets that robot alone put there and monitors subscribe
(`servo.router.acl`).

Nobody but its readers reads a record: the robot encrypts one copy of it to each reader (the
operators its trusted server names in the session ack, or those it was given), each copy under a
key exchanged between a fresh X25519 key and the reader's identity (`seal_telemetry`,
`servo._core.ServerIdentity.session_key`), and sends them in one `SealedTelemetry`. Every
message is signed by the robot's Ed25519 identity: the attachment is the signer's public key
(32 bytes) followed by its signature (64 bytes) over `signed_bytes`: a context, the client id
and the body (the sealed copies), so a record signed for one robot is worthless on another
robot's key. A reader first asks whether it trusts that key for that robot (`telemetry_signer`
reads both without any cryptography: a stranger costs nothing more), then verifies the
signature, then decrypts its own copy (`open_telemetry`).

Like every body of the protocol the record carries no wall-clock instant: ``age_ms`` of a
transition is a duration on the robot's monotonic clock, measured when the record left. ``run``
(counting up across the robot's runs, kept in its servo directory) and ``seq`` (counting up
within a run) let a reader refuse replays, even of a run it never saw.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Annotated, Protocol

import msgspec

from servo import _core
from servo.wire.codec import decode, encode
from servo.wire.errors import WireError
from servo.wire.keys import ROOT, segment
from servo.wire.messages import MAX_NAME_CHARS, Name, PublicKey

#: The verbatim chunk under which robot-level keys live.
ROBOTS_CHUNK = "@robots"
#: What a telemetry signature covers besides the client id and the body.
TELEMETRY_CONTEXT = b"servo/3 edge-telemetry\0"
#: Attachment of a telemetry record: public key || signature.
TELEMETRY_ATTACHMENT_SIZE = _core.PUBLIC_KEY_SIZE + _core.SIGNATURE_SIZE
#: Largest record (plaintext; a record is a few hundred bytes), most readers one message
#: carries copies for, and the largest message a receiver copies out of Zenoh.
MAX_RECORD_BYTES = 8192
MAX_READERS = 8
MAX_TELEMETRY_BYTES = MAX_READERS * (MAX_RECORD_BYTES + 256)
#: How a copy names its reader: the first bytes of the reader's Ed25519 key.
READER_ID_SIZE = 8
#: Most transitions one record carries (those since the previous record, newest last).
MAX_TRANSITIONS = 16
#: Longest reason text of a transition (characters).
MAX_REASON_CHARS = 256

Millis = Annotated[float, msgspec.Meta(ge=0.0)]
Count = Annotated[int, msgspec.Meta(ge=0)]
Reason = Annotated[str, msgspec.Meta(max_length=MAX_REASON_CHARS)]


class Transition(msgspec.Struct, frozen=True, array_like=True):
    """One fail-safe transition: the state entered, why, and how long ago (ms, robot's clock)."""

    state: Name
    reason: Reason
    age_ms: Millis


class EdgeTelemetry(msgspec.Struct, frozen=True):
    """What a robot reports about itself (`servo.edge.telemetry` builds it from engine snapshots).

    ``transitions`` are the fail-safe transitions since the previous record (at most
    `MAX_TRANSITIONS`, newest last); ``last_transition`` is the newest one ever, so a monitor
    that joins late still knows why the robot is where it is. Latencies are milliseconds;
    ``None`` where nothing was measured yet. ``codec`` is the camera codec in use (``raw``,
    ``jpeg90``…, empty for a local engine); ``replica`` the replica serving the robot (empty
    while it has none). ``goodbye`` is set on the last record of a run that ended on purpose
    (why it stopped: ``signal``, ``duration``…), so a monitor tells a stopped robot from one that
    went silent; empty while the robot runs.
    """

    client_id: Name
    run: Count
    seq: Count
    period_ms: Millis
    state: Name
    replica: Name = ""
    model: Annotated[str, msgspec.Meta(max_length=MAX_NAME_CHARS)] = ""
    rtt_ms_p50: Millis | None = None
    rtt_ms_p99: Millis | None = None
    delay_steps: Count = 0
    queue_depth: Count = 0
    fallback_ticks: Count = 0
    tick_lateness_ms_p99: Millis | None = None
    missed_deadlines: Count = 0
    codec: Name = ""
    requests: Count = 0
    reconnects: Count = 0
    timeouts: Count = 0
    chunks_rejected: Annotated[dict[Name, Count], msgspec.Meta(max_length=32)] = {}
    last_transition: Transition | None = None
    transitions: Annotated[list[Transition], msgspec.Meta(max_length=MAX_TRANSITIONS)] = []
    goodbye: Reason = ""

    def __post_init__(self) -> None:
        """Refuse non-finite latencies (msgspec turns the ValueError into a decode error)."""
        for name in ("period_ms", "rtt_ms_p50", "rtt_ms_p99", "tick_lateness_ms_p99"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} {value} is not finite")


def telemetry_key(client_id: str) -> str:
    """The key robot ``client_id`` publishes its telemetry on (validated)."""
    return f"{ROOT}/{ROBOTS_CHUNK}/{segment(client_id, what='client_id')}/telemetry"


#: What a monitor subscribes to: every robot's telemetry.
TELEMETRY_SELECTOR = f"{ROOT}/{ROBOTS_CHUNK}/*/telemetry"


def client_of_telemetry(key: str) -> str:
    """The client id in a telemetry key.

    Raises:
        WireError: the key is not ``@servo/@robots/<client>/telemetry``.
    """
    parts = key.split("/")
    if len(parts) != 4 or parts[0] != ROOT or parts[1] != ROBOTS_CHUNK or parts[3] != "telemetry":
        raise WireError(f"key {key[:200]!r} is not {ROOT}/{ROBOTS_CHUNK}/<client>/telemetry")
    return segment(parts[2], what="client_id")


class SealedCopy(msgspec.Struct, frozen=True, array_like=True):
    """One reader's copy of a record: the robot's fresh X25519 key, the cipher's attachment, the ciphertext."""

    reader: Annotated[bytes, msgspec.Meta(min_length=READER_ID_SIZE, max_length=READER_ID_SIZE)]
    ephemeral: PublicKey
    attachment: Annotated[bytes, msgspec.Meta(min_length=_core.ATTACHMENT_SIZE, max_length=_core.ATTACHMENT_SIZE)]
    ciphertext: Annotated[bytes, msgspec.Meta(max_length=MAX_RECORD_BYTES)]


class SealedTelemetry(msgspec.Struct, frozen=True):
    """What a robot publishes: its record, one encrypted copy per reader."""

    client_id: Name
    copies: Annotated[list[SealedCopy], msgspec.Meta(max_length=MAX_READERS)] = []


class Reader(Protocol):
    """Who reads telemetry: an operator's identity (`servo._core.ServerIdentity` is one)."""

    @property
    def public_key(self) -> bytes:
        """Its Ed25519 public key (what robots encrypt to)."""
        ...

    @property
    def exchange_public_key(self) -> bytes:
        """Its X25519 public key."""
        ...

    def session_key(
        self, peer_public: bytes, *, client_public: bytes, server_public: bytes, session_id: bytes
    ) -> _core.SessionKey:
        """Its end of the exchange with a copy's ephemeral key."""
        ...


def signed_bytes(client_id: str, body: bytes | memoryview) -> bytes:
    """The bytes a telemetry signature covers: context, client id, NUL, body."""
    return TELEMETRY_CONTEXT + client_id.encode() + b"\0" + bytes(body)


class Signer(Protocol):
    """What signs telemetry: a robot's Ed25519 identity (`servo._core.ServerIdentity` is one)."""

    @property
    def public_key(self) -> bytes:
        """The 32-byte public key receivers check the signature with."""
        ...

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``message``."""
        ...


def seal_telemetry(record: EdgeTelemetry, signer: Signer, readers: Sequence[bytes]) -> tuple[bytes, bytes]:
    """``(body, attachment)`` of a record encrypted to each of ``readers`` (Ed25519 keys), signed by ``signer``.

    Raises:
        AuthError: a reader's key is no Ed25519 public key.
    """
    plain = encode(record)
    copies = []
    for reader in list(dict.fromkeys(readers))[:MAX_READERS]:
        exchange = _core.exchange_public_key(reader)
        pair, session_id = _core.KeyPair(), os.urandom(_core.SESSION_ID_SIZE)
        key = pair.session_key(exchange, client_public=pair.public_key, server_public=exchange, session_id=session_id)
        header = _core.Header(_core.SCHEMA_VERSION, _core.MSG_OBS, 0, record.seq, 0, 0, 0, session_id)
        attachment, ciphertext = key.encrypt(header, plain)
        copies.append(SealedCopy(reader[:READER_ID_SIZE], pair.public_key, attachment, ciphertext))
    body = encode(SealedTelemetry(record.client_id, copies))
    return body, signer.public_key + signer.sign(signed_bytes(record.client_id, body))


def telemetry_signer(key: str, size: int, attachment: bytes | None) -> tuple[str, bytes]:
    """``(robot, signer key)`` a telemetry message on ``key`` claims, from sizes and bytes alone.

    Nothing is verified yet: ask whether that key is trusted for that robot before spending a
    signature check on it.

    Raises:
        WireError: not a telemetry key, a missing or malformed attachment, an oversized body.
    """
    client_id = client_of_telemetry(key)
    if attachment is None or len(attachment) != TELEMETRY_ATTACHMENT_SIZE:
        got = 0 if attachment is None else len(attachment)
        raise WireError(f"telemetry attachment is {got} bytes, expected {TELEMETRY_ATTACHMENT_SIZE}")
    if size > MAX_TELEMETRY_BYTES:
        raise WireError(f"telemetry of {size} bytes exceeds the limit of {MAX_TELEMETRY_BYTES}")
    return client_id, bytes(attachment[: _core.PUBLIC_KEY_SIZE])


def open_telemetry(key: str, body: bytes, attachment: bytes | None, reader: Reader) -> EdgeTelemetry:
    """Verify a received message, then decrypt ``reader``'s copy and decode the record.

    The signature is checked before anything is decoded; the message and the record must name
    the client its key names.

    Raises:
        WireError: see `telemetry_signer`; a bad signature; a malformed message; no copy for
            ``reader``; a copy that does not decrypt; a record naming another client.
    """
    client_id, public_key = telemetry_signer(key, len(body), attachment)
    assert attachment is not None
    if not _core.verify_signature(public_key, signed_bytes(client_id, body), attachment[_core.PUBLIC_KEY_SIZE :]):
        raise WireError(f"telemetry of {client_id!r}: the signature does not verify")
    sealed = decode(body, SealedTelemetry, max_bytes=MAX_TELEMETRY_BYTES)
    if sealed.client_id != client_id:
        raise WireError(f"telemetry on {client_id!r}'s key names client {sealed.client_id!r}")
    mine = reader.public_key[:READER_ID_SIZE]
    copy = next((c for c in sealed.copies if c.reader == mine), None)
    if copy is None:
        raise WireError(f"telemetry of {client_id!r} is not encrypted to this reader")
    try:
        session_id = _core.decode_header(copy.attachment).session_id
        own = reader.exchange_public_key
        key_ = reader.session_key(
            copy.ephemeral, client_public=copy.ephemeral, server_public=own, session_id=session_id
        )
        _, plain = key_.decrypt(copy.attachment, copy.ciphertext)
    except (_core.AuthError, _core.HeaderError) as exc:
        raise WireError(f"telemetry of {client_id!r}: this reader's copy does not decrypt ({exc})") from None
    record = decode(plain, EdgeTelemetry, max_bytes=MAX_RECORD_BYTES)
    if record.client_id != client_id:
        raise WireError(f"telemetry on {client_id!r}'s key names client {record.client_id!r}")
    return record
