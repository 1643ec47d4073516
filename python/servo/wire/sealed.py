"""Answers only their asker can read and only the replica could send: sealed replies.

A query that carries an ephemeral X25519 key (``client_key``) and a fresh nonce gets its answer
encrypted to that key, like a session body (`servo._core.SessionKey`: the replica makes its own
ephemeral key pair, the nonce is the "session" id, `reply_header` the header), and signed by the
replica's identity over the ciphertext, the replica's ephemeral key and the question
(`sealed_transcript`): the asker verifies the signature under the identity it trusts, then
decrypts. Signing the ciphertext, not the plaintext, gives an eavesdropper no way to test a
guess of the answer; binding the asker's fresh key makes an old answer worthless.

The reply's attachment is the replica's ephemeral key, the cipher's attachment (header || tag)
and the signature: `SEALED_ATTACHMENT_SIZE` bytes. The trajectory fetch and the audit query
answer this way; each names its own context, so no signature made for one is worth anything to
the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec

from servo._core import (
    ATTACHMENT_SIZE,
    MSG_CHUNK,
    PUBLIC_KEY_SIZE,
    SCHEMA_VERSION,
    SIGNATURE_SIZE,
    AuthError,
    Header,
    HeaderError,
    KeyPair,
    verify_signature,
)
from servo.wire.errors import WireError

#: Attachment of a sealed reply: the replica's ephemeral X25519 key, the cipher's attachment, the signature.
SEALED_ATTACHMENT_SIZE = PUBLIC_KEY_SIZE + ATTACHMENT_SIZE + SIGNATURE_SIZE


class Signer(Protocol):
    """What signs a sealed reply: the replica's Ed25519 identity."""

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``message``."""
        ...


def reply_header(nonce: bytes) -> Header:
    """The header a sealed reply is encrypted under (a server message of the query's "session")."""
    return Header(SCHEMA_VERSION, MSG_CHUNK, 0, 0, 0, 0, 0, nonce)


def sealed_transcript(
    context: bytes, question: Sequence[object], server_key: bytes, attachment: bytes, ciphertext: bytes
) -> bytes:
    """What the replica signs: the context, the question (msgpack), its key, the cipher's attachment, the ciphertext."""
    return context + msgspec.msgpack.encode([*question, server_key, attachment]) + ciphertext


def seal_reply(
    body: bytes, *, client_key: bytes, nonce: bytes, context: bytes, question: Sequence[object], signer: Signer
) -> tuple[bytes, bytes]:
    """``(ciphertext, attachment)``: ``body`` encrypted to ``client_key`` and signed by ``signer``.

    Raises:
        AuthError: ``client_key`` is unusable (its length, a low-order point) or ``nonce`` is not
            16 bytes.
    """
    pair = KeyPair()
    key = pair.session_key(client_key, client_public=client_key, server_public=pair.public_key, session_id=nonce)
    attachment, ciphertext = key.encrypt(reply_header(nonce), body)
    signature = signer.sign(sealed_transcript(context, question, pair.public_key, attachment, ciphertext))
    return ciphertext, pair.public_key + attachment + signature


def signed_by(signer: bytes, payload: bytes, proof: bytes, *, context: bytes, question: Sequence[object]) -> bool:
    """Whether ``proof`` (a sealed reply's attachment) is ``signer``'s signature of ``payload`` for ``question``."""
    if len(proof) != SEALED_ATTACHMENT_SIZE:
        return False
    server_key, attachment = proof[:PUBLIC_KEY_SIZE], proof[PUBLIC_KEY_SIZE:-SIGNATURE_SIZE]
    transcript = sealed_transcript(context, question, server_key, attachment, payload)
    return verify_signature(signer, transcript, proof[-SIGNATURE_SIZE:])


def open_reply(pair: KeyPair, nonce: bytes, payload: bytes, proof: bytes) -> bytes:
    """The plaintext of a sealed reply whose signature `signed_by` accepted; uses ``pair`` up.

    Raises:
        WireError: it does not decrypt, or was encrypted for another question (only the replica
            could have sent it: a bug, or another query's answer).
    """
    server_key, attachment = proof[:PUBLIC_KEY_SIZE], proof[PUBLIC_KEY_SIZE:-SIGNATURE_SIZE]
    try:
        key = pair.session_key(server_key, client_public=pair.public_key, server_public=server_key, session_id=nonce)
        header, plaintext = key.decrypt(attachment, payload)
    except (AuthError, HeaderError) as exc:
        raise WireError(f"a signed reply does not decrypt: {exc}") from None
    if header != reply_header(nonce):
        raise WireError("a signed reply was encrypted for another question")
    return plaintext
