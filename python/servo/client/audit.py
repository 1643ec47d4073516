"""Asking a replica for its recent requests, as an operator (the fleet) or as a robot (its own).

The query is signed by the asker's identity over the replica's key prefix and the nonce its
status handed out, and carries a fresh X25519 key; the answer is sealed to that key and signed by
the replica (`servo.wire.audit`, `servo.wire.sealed`). Only an answer signed by the identity the
caller trusts for that replica (its status' ``identity``, as discovery or the monitor verified
it) is believed; any other is counted as forged and skipped.
"""

from __future__ import annotations

import msgspec
import zenoh

from servo._core import KeyPair
from servo.client.errors import RequestTimeout, RogueServer, ServerError
from servo.client.replies import rejection_of
from servo.identity import Identity
from servo.transport import query
from servo.wire import (
    AUDIT_CONTEXT,
    AuditQuery,
    AuditTail,
    ServerKeys,
    StatusReply,
    WireError,
    audit_question,
    audit_transcript,
    decode,
    encode,
)
from servo.wire.sealed import open_reply, signed_by


async def ask_audit(
    zsession: zenoh.Session,
    keys: ServerKeys,
    status: StatusReply,
    identity: Identity,
    request: AuditQuery,
    *,
    timeout: float,
) -> AuditTail:
    """The replica's answer to ``request`` (its question fields), asked as ``identity``.

    ``status`` is the replica's verified status: its ``identity`` must sign the answer, its
    ``nonce`` makes the query fresh.

    Raises:
        ServerError: the replica refused (e.g. ``unauthenticated``: not an operator of it, nor
            the robot whose requests were asked for).
        RogueServer: only answers that failed verification came back.
        WireError: the replica's signed answer does not decrypt or decode.
        RequestTimeout: no answer in time.
    """
    pair = KeyPair()
    asked = msgspec.structs.replace(request, asker=identity.public_key, reply_key=pair.public_key, nonce=status.nonce)
    asked = msgspec.structs.replace(asked, signature=identity.sign(audit_transcript(asked, keys.prefix)))
    question = audit_question(asked, keys.replica)
    refusal, forged = None, 0
    for reply in await query(zsession, keys.audit, payload=encode(asked), timeout=timeout):
        if reply.ok is not None:
            payload = reply.ok.payload.to_bytes()
            proof = b"" if reply.ok.attachment is None else reply.ok.attachment.to_bytes()
            if signed_by(status.identity, payload, proof, context=AUDIT_CONTEXT, question=question):
                tail = decode(open_reply(pair, asked.nonce, payload, proof), AuditTail)
                if tail.replica != keys.replica:
                    raise WireError(f"replica {keys.replica}'s audit answer names {tail.replica!r}")
                return tail
            forged += 1
        elif (rejection := rejection_of(reply)) is not None:
            refusal = rejection
    if refusal is not None:
        raise ServerError(refusal.code, refusal.reason)
    if forged:
        raise RogueServer(f"replica {keys.replica}: {forged} audit answer(s) not signed by it")
    raise RequestTimeout(f"replica {keys.replica}'s audit not answered within {timeout:g} s")
