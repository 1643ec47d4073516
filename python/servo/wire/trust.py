"""What the identities sign and prove, and how identities are written down.

Both ends build these bytes the same way, so they live in the wire layer. Every transcript starts
with its own context string, so a signature made for one purpose never verifies for another (the
server signs notices for whatever header an observation claimed: that must not make it sign an
ack or a trajectory).

* `open_transcript`: what a robot's Ed25519 identity signs in a `SessionOpen`: every field of
  the open (the client id, its ephemeral X25519 key, the features, the task, the epoch, the
  resume proof) and the replica's key prefix and nonce, so an open can be neither altered, nor
  sent to another replica, nor replayed once the nonce is old (the server refuses a nonce it
  did not hand out in the last minute, and an X25519 key it saw already).
* `join_transcript`: what a join token's key signs (`servo.join`): the open transcript under its
  own context, so the proof is bound to this open (its nonce, X25519 key, robot key and name, the
  replica) and worth nothing for any other.
* `ack_transcript`: what a replica's Ed25519 identity signs in a `SessionAck`. It binds the
  client's and the server's ephemeral X25519 keys, the session id and the replica: an edge that
  verifies it knows that the session key it derives is shared with the holder of that identity,
  for this session on this replica, and nobody else (a peer that answered the session-open
  query first holds no identity the edge trusts, or cannot sign this transcript). It binds the
  operators the ack names too: the robot encrypts its telemetry to them
  (`servo.wire.telemetry`), so nobody but the replica may choose them.
* `TRAJECTORY_CONTEXT` / `rejection_transcript`: what a replica signs when it answers a
  trajectory fetch (a sealed reply, `servo.wire.sealed`, or its refusal): bound to the client's
  fresh nonce, the replica and the name asked for, so nobody else's answer, and no old answer,
  is believed.
* `status_transcript`: what a replica signs in a status reply (its attachment): the body, bound
  to the asker's nonce when it sent one (a monitor does), so a monitor believes a replica's
  status only when a replica it trusts said it, just now.
* `notice_transcript`: what a replica signs in a notice it cannot seal because it holds no key
  for the session (``unknown_session``): bound to the replica, the client it goes to and the
  header of the request it answers, so it only ends that request, of that client, on that replica
  (a notice the replica signed for an observation re-published under another client id is
  worth nothing to the robot whose header it echoes).
* `resume_body`: what an old session key proves (`SessionKey.authenticate`) to let a new open
  replace its session.
* `fingerprint` / `parse_fingerprint`: the text form of an identity (``ed25519:`` + urlsafe
  base64 of the 32-byte public key, no padding), as printed by ``servo-serve`` and pinned in an
  edge's ``trusted_servers``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

import msgspec

from servo._core import HEADER_SIZE, PUBLIC_KEY_SIZE
from servo.wire.errors import WireError
from servo.wire.messages import SessionOpen

#: Prefix of an identity fingerprint.
FINGERPRINT_PREFIX = "ed25519:"
ACK_CONTEXT = b"servo/3 session-ack\0"
RESUME_CONTEXT = b"servo/2 session-resume\0"
OPEN_CONTEXT = b"servo/2 session-open\0"
#: The context of a sealed trajectory answer (`servo.wire.sealed`); its question is [nonce, replica, name].
TRAJECTORY_CONTEXT = b"servo/3 sealed-trajectory\0"
REJECTION_CONTEXT = b"servo/2 trajectory-refused\0"
NOTICE_CONTEXT = b"servo/2 keyless-notice\0"
STATUS_CONTEXT = b"servo/3 status\0"
JOIN_CONTEXT = b"servo/2 join-token\0"


def open_transcript(request: SessionOpen, prefix: str) -> bytes:
    """The bytes a `SessionOpen.robot_signature` signs, for the replica whose key prefix is ``prefix``."""
    fields = [
        prefix,
        request.client_id,
        request.schema_versions,
        request.features,
        request.fps,
        request.client_key,
        request.task,
        request.rtc,
        request.session_epoch,
        request.tags,
        request.resume,
        request.robot_key,
        request.nonce,
    ]
    if request.join_id:  # added by joins only: the transcript of every other open is unchanged
        fields.append(request.join_id)
    return OPEN_CONTEXT + msgspec.msgpack.encode(fields)


def join_transcript(request: SessionOpen, prefix: str) -> bytes:
    """The bytes a `SessionOpen.join_signature` signs: the open transcript, under the join context."""
    return JOIN_CONTEXT + open_transcript(request, prefix)[len(OPEN_CONTEXT) :]


def rejection_transcript(nonce: bytes, replica: str, name: str, code: str, reason: str) -> bytes:
    """What a replica signs when it refuses the trajectory fetch ``nonce``."""
    return REJECTION_CONTEXT + msgspec.msgpack.encode([nonce, replica, name, code, reason])


def status_transcript(nonce: bytes, body: bytes) -> bytes:
    """What a replica signs in a status reply: the asker's nonce (empty when none) and the reply's body."""
    return STATUS_CONTEXT + msgspec.msgpack.encode([nonce]) + body


def notice_transcript(action_key: str, attachment: bytes, code: str, message: str) -> bytes:
    """What a replica signs in a keyless notice: where it goes (the client's action key), its header, the event."""
    return NOTICE_CONTEXT + msgspec.msgpack.encode([action_key, attachment[:HEADER_SIZE], code, message])


def ack_transcript(
    client_key: bytes, server_key: bytes, session_id: bytes, replica: str, operators: Sequence[bytes] = ()
) -> bytes:
    """The bytes a `SessionAck.signature` signs (wire schema 3: the operators it names too)."""
    return ACK_CONTEXT + msgspec.msgpack.encode([client_key, server_key, session_id, replica, list(operators)])


def resume_body(client_key: bytes) -> bytes:
    """What a resume proof (`SessionOpen.resume`) seals: the context and the new client key.

    Binding the new ``client_key`` makes a sniffed proof worthless to anybody else: it only lets
    the handshake whose secret half the client holds replace the old session.
    """
    return RESUME_CONTEXT + client_key


def b64(data: bytes) -> str:
    """Urlsafe base64 without padding: how identities and join tokens write bytes."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64(text: str, size: int) -> bytes:
    """The ``size`` bytes ``text`` (`b64`) encodes, in its one canonical spelling.

    Raises:
        WireError: not urlsafe base64, or not of ``size`` bytes.
    """
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise WireError("is not urlsafe base64") from None
    if len(data) != size or b64(data) != text:
        raise WireError(f"does not encode {size} bytes")
    return data


def fingerprint(public_key: bytes) -> str:
    """``ed25519:<urlsafe base64, no padding>`` of a 32-byte Ed25519 public key."""
    return FINGERPRINT_PREFIX + b64(public_key)


def parse_fingerprint(text: str) -> bytes:
    """The public key a fingerprint names.

    Raises:
        WireError: not ``ed25519:`` followed by the urlsafe base64 of 32 bytes.
    """
    if not text.startswith(FINGERPRINT_PREFIX):
        raise WireError(f"fingerprint {text[:80]!r} does not start with {FINGERPRINT_PREFIX!r}")
    try:
        return unb64(text[len(FINGERPRINT_PREFIX) :], PUBLIC_KEY_SIZE)
    except WireError as exc:
        raise WireError(f"fingerprint {text[:80]!r} {exc}") from None
