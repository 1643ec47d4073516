"""Join tokens: a robot enrols itself on a server, and learns whom to trust, with one command.

In the style of ``kubeadm join``: ``servo-serve`` (or ``servo-serve robots token``) issues a
short-lived token that one robot (or N) may use once, and prints the robot's command with it;
``servo-edge … --join TOKEN`` proves the token in its first session open and is enrolled under
its own key and name, and the token tells the robot which server to trust, so first contact
needs no trust on first use. The token is one line of text::

    servo-join-v1.<id>.<secret>.<identity>[.<certificate>]

* ``id``: 8 characters of lowercase base32 (5 random bytes) naming the token, public: shown by
  ``servo-serve robots list`` and used to revoke it.
* ``secret``: urlsafe base64 of 16 random bytes (128 bits), the only secret part. It seeds an
  Ed25519 key (SHA-256 of a context, the id and the secret): the robot signs its session open with
  it, and the server keeps only the public half (the *verifier*). A verifier is a one-way function
  of the secret, like a password hash, and proves nothing by itself: whoever reads the server's
  roster still cannot use a token.
* ``identity``: the server's Ed25519 identity (the text after ``ed25519:`` of its fingerprint). The
  robot trusts that identity for the deployment (written to ``known_servers``) before it ever
  connects, so a rogue server alone on the network at first contact is refused.
* ``certificate`` (only with servo's self-signed TLS certificate): SHA-256 of the certificate's
  public key (SubjectPublicKeyInfo). The robot fetches the certificate from the server's TLS
  endpoint and uses it only if its key hashes to this, so no certificate is copied by hand
  (a reissued certificate keeps its key, and the pin).

**The proof is bound to one open.** ``SessionOpen.join_signature`` signs
`servo.wire.trust.join_transcript`: the whole open, including the replica's fresh nonce, the
open's single-use X25519 key, the robot's key and its name. A captured open replays nothing (the
nonce and X25519 key are refused a second time), cannot be sent to another replica, and cannot
enrol another key or name. The secret itself never leaves the robot.

Server side: `servo.server.roster` (storage), `servo.server.joins` (checks and spending).
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from dataclasses import dataclass

import msgspec

from servo._core import PUBLIC_KEY_SIZE, verify_signature
from servo._core import ServerIdentity as Identity
from servo.errors import SecurityError
from servo.wire import SessionOpen, WireError, join_transcript
from servo.wire.trust import b64, unb64

__all__ = ["JoinToken", "JoinTokenError", "sign_join", "verify_join"]

#: The first field of every token (the format's version).
PREFIX = "servo-join-v1"
SECRET_BYTES = 16
PIN_BYTES = 32
_ID_BYTES = 5
_KEY_CONTEXT = b"servo-join-v1 token key\0"
_ID = re.compile(r"[a-z2-7]{8}")


class JoinTokenError(SecurityError, ValueError):
    """Text that is no usable join token; the message says what is wrong (never the secret)."""


def _unb64(text: str, size: int, what: str) -> bytes:
    try:
        return unb64(text, size)
    except WireError as exc:
        raise JoinTokenError(f"its {what} {exc}") from None


def new_token_id() -> str:
    """A fresh token id (8 characters of lowercase base32)."""
    return base64.b32encode(secrets.token_bytes(_ID_BYTES)).decode().lower()


@dataclass(frozen=True)
class JoinToken:
    """A parsed join token (module docstring). Immutable.

    Args:
        id: The token's public name.
        secret: Its 16 secret bytes.
        server: The server's Ed25519 public key.
        certificate: SHA-256 of the server certificate's public key; empty when not pinned.
    """

    id: str
    secret: bytes
    server: bytes
    certificate: bytes = b""

    @classmethod
    def issue(cls, server: bytes, certificate: bytes = b"") -> JoinToken:
        """A new token for the server whose identity is ``server``."""
        return cls(new_token_id(), secrets.token_bytes(SECRET_BYTES), server, certificate)

    @classmethod
    def parse(cls, text: str) -> JoinToken:
        """The token ``text`` spells.

        Raises:
            JoinTokenError: anything malformed (the message never repeats the secret).
        """
        parts = text.strip().split(".")
        if parts[0] != PREFIX or len(parts) not in (4, 5):
            raise JoinTokenError(f"not a servo join token (expected {PREFIX}.<id>.<secret>.<identity>[.<certificate>])")
        token_id = parts[1]
        if not _ID.fullmatch(token_id):
            raise JoinTokenError("its id is not 8 characters of lowercase base32")
        secret = _unb64(parts[2], SECRET_BYTES, "secret")
        server = _unb64(parts[3], PUBLIC_KEY_SIZE, "server identity")
        certificate = _unb64(parts[4], PIN_BYTES, "certificate pin") if len(parts) == 5 else b""
        return cls(token_id, secret, server, certificate)

    def __str__(self) -> str:
        fields = [PREFIX, self.id, b64(self.secret), b64(self.server)]
        if self.certificate:
            fields.append(b64(self.certificate))
        return ".".join(fields)

    def __repr__(self) -> str:  # never the secret, in logs or tracebacks
        return f"JoinToken(id={self.id!r})"

    def key(self) -> Identity:
        """The Ed25519 key the secret seeds: it signs the proof (`sign_join`)."""
        return Identity.from_seed(hashlib.sha256(_KEY_CONTEXT + self.id.encode() + self.secret).digest())

    @property
    def verifier(self) -> bytes:
        """The public half of `key`: all a server stores (`verify_join`)."""
        return self.key().public_key


def sign_join(request: SessionOpen, token: JoinToken, prefix: str) -> SessionOpen:
    """``request`` (complete: nonce, keys and robot signature in place) with the token's proof added."""
    return msgspec.structs.replace(request, join_signature=token.key().sign(join_transcript(request, prefix)))


def verify_join(request: SessionOpen, prefix: str, verifier: bytes) -> bool:
    """Whether ``request`` proves the token whose verifier is ``verifier``, for the replica ``prefix``."""
    return verify_signature(verifier, join_transcript(request, prefix), request.join_signature)
