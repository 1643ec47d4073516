"""Edge telemetry: the small status record each robot publishes about once a second.

A robot publishes on its own key, `telemetry_key` (``@servo/@robots/<client>/telemetry``). The
second chunk is verbatim, so no server's key (``@servo/<app>/…``, whose segments never start
with ``@``) can collide with it, and no wildcard over servers (``@servo/*/*/*/…``) reaches it;
a router's access control lets that robot alone put there and monitors subscribe
(`servo.router.acl`).

Every record is signed by the robot's Ed25519 identity. The attachment is the signer's public
key (32 bytes) followed by its signature (64 bytes) over `signed_bytes`: a context, the client
id and the body, so a record signed for one robot is worthless on another robot's key. A
receiver verifies the signature before it decodes anything (`open_telemetry`), then decides
whether it trusts that key for that robot (pins or first use, `servo.monitor.trust`).

Like every body of the protocol the record carries no wall-clock instant: ``age_ms`` of a
transition is a duration on the robot's monotonic clock, measured when the record left. ``boot``
(random per run) and ``seq`` (counting up within a run) let a receiver refuse replays.
"""

from __future__ import annotations

import math
from typing import Annotated, Protocol

import msgspec

from servo import _core
from servo.wire.codec import decode, encode
from servo.wire.errors import WireError
from servo.wire.keys import ROOT, segment
from servo.wire.messages import MAX_NAME_CHARS, Name

#: The verbatim chunk under which robot-level keys live.
ROBOTS_CHUNK = "@robots"
#: What a telemetry signature covers besides the client id and the body.
TELEMETRY_CONTEXT = b"servo/2 edge-telemetry\0"
#: Attachment of a telemetry record: public key || signature.
TELEMETRY_ATTACHMENT_SIZE = _core.PUBLIC_KEY_SIZE + _core.SIGNATURE_SIZE
#: Largest telemetry body a receiver decodes (a record is a few hundred bytes).
MAX_TELEMETRY_BYTES = 8192
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
    boot: Annotated[bytes, msgspec.Meta(min_length=8, max_length=8)]
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


def seal_telemetry(record: EdgeTelemetry, signer: Signer) -> tuple[bytes, bytes]:
    """``(body, attachment)`` of a record, signed by ``signer``."""
    body = encode(record)
    return body, signer.public_key + signer.sign(signed_bytes(record.client_id, body))


def open_telemetry(key: str, body: bytes | memoryview, attachment: bytes | None) -> tuple[bytes, EdgeTelemetry]:
    """Verify a received record, then decode it; returns the signer's public key and the record.

    The signature is checked before anything is decoded; the record must name the client its
    key names.

    Raises:
        WireError: a key that is not a telemetry key, a missing or malformed attachment, a bad
            signature, an oversized or malformed body, or a body naming another client.
    """
    client_id = client_of_telemetry(key)
    if attachment is None or len(attachment) != TELEMETRY_ATTACHMENT_SIZE:
        size = 0 if attachment is None else len(attachment)
        raise WireError(f"telemetry attachment is {size} bytes, expected {TELEMETRY_ATTACHMENT_SIZE}")
    if len(body) > MAX_TELEMETRY_BYTES:
        raise WireError(f"telemetry of {len(body)} bytes exceeds the limit of {MAX_TELEMETRY_BYTES}")
    public_key = bytes(attachment[: _core.PUBLIC_KEY_SIZE])
    signature = bytes(attachment[_core.PUBLIC_KEY_SIZE :])
    if not _core.verify_signature(public_key, signed_bytes(client_id, body), signature):
        raise WireError(f"telemetry of {client_id!r}: the signature does not verify")
    record = decode(body, EdgeTelemetry, max_bytes=MAX_TELEMETRY_BYTES)
    if record.client_id != client_id:
        raise WireError(f"telemetry on {client_id!r}'s key names client {record.client_id!r}")
    return public_key, record
