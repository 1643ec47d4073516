"""What the handshake signs and proves, and how server identities are written down.

Both ends build these bytes the same way, so they live in the wire layer:

* `ack_transcript`: what a replica's Ed25519 identity signs in a `SessionAck`. It binds the
  client's and the server's ephemeral X25519 keys, the session id and the replica: an edge that
  verifies it knows that the session key it derives is shared with the holder of that identity,
  for this session on this replica, and nobody else (a peer that answered the session-open
  query first holds no identity the edge trusts, or cannot sign this transcript).
* `resume_body`: what an old session key seals to let a new open replace its session.
* `fingerprint` / `parse_fingerprint`: the text form of an identity (``ed25519:`` + urlsafe
  base64 of the 32-byte public key, no padding), as printed by ``servo-serve`` and pinned in an
  edge's ``trusted_servers``.
"""

from __future__ import annotations

import base64
import binascii

from servo._core import PUBLIC_KEY_SIZE
from servo.wire.errors import WireError

#: Prefix of an identity fingerprint.
FINGERPRINT_PREFIX = "ed25519:"
ACK_CONTEXT = b"servo/2 session-ack\0"
RESUME_CONTEXT = b"servo/2 session-resume\0"


def ack_transcript(client_key: bytes, server_key: bytes, session_id: bytes, replica: str) -> bytes:
    """The bytes a `SessionAck.signature` signs (wire schema 2)."""
    return ACK_CONTEXT + client_key + server_key + session_id + replica.encode()


def resume_body(client_key: bytes) -> bytes:
    """What a resume proof (`SessionOpen.resume`) seals: the context and the new client key.

    Binding the new ``client_key`` makes a sniffed proof worthless to anybody else: it only lets
    the handshake whose secret half the client holds replace the old session.
    """
    return RESUME_CONTEXT + client_key


def fingerprint(public_key: bytes) -> str:
    """``ed25519:<urlsafe base64, no padding>`` of a 32-byte Ed25519 public key."""
    return FINGERPRINT_PREFIX + base64.urlsafe_b64encode(public_key).rstrip(b"=").decode()


def parse_fingerprint(text: str) -> bytes:
    """The public key a fingerprint names.

    Raises:
        WireError: not ``ed25519:`` followed by the urlsafe base64 of 32 bytes.
    """
    if not text.startswith(FINGERPRINT_PREFIX):
        raise WireError(f"fingerprint {text[:80]!r} does not start with {FINGERPRINT_PREFIX!r}")
    encoded = text[len(FINGERPRINT_PREFIX) :]
    try:
        key = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except (binascii.Error, ValueError):
        raise WireError(f"fingerprint {text[:80]!r} is not urlsafe base64") from None
    if len(key) != PUBLIC_KEY_SIZE or fingerprint(key) != text:
        raise WireError(f"fingerprint {text[:80]!r} does not encode a {PUBLIC_KEY_SIZE}-byte key")
    return key
