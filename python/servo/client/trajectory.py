"""Fetching a trajectory from a server's library, believing only the server's own answer.

The request carries a fresh random nonce; the replica signs its answer (the trajectory's bytes,
or its refusal) over that nonce, its replica id and the name asked for
(`servo.wire.trust.trajectory_transcript`, `rejection_transcript`). An answer is believed only
if the signature verifies under the identity discovery trusted for that replica (pins or known
servers, as for a session ack): anybody else's trajectory, a replay of an old one, or a forged
refusal is dropped and counted (``chunks_rejected["mac"]``), never executed or obeyed.
"""

from __future__ import annotations

import secrets

import zenoh

from servo._core import SIGNATURE_SIZE, verify_signature
from servo.client.discovery import ServerInfo
from servo.client.errors import RequestTimeout, RogueServer, ServerError
from servo.client.replies import rejection_of
from servo.client.verify import ClientCounters
from servo.transport import query
from servo.wire import (
    NONCE_SIZE,
    Rejection,
    Trajectory,
    TrajectoryRequest,
    decode,
    encode,
    rejection_transcript,
    trajectory_transcript,
)


async def fetch_trajectory(
    zsession: zenoh.Session, server: ServerInfo, name: str, *, counters: ClientCounters, timeout: float
) -> Trajectory:
    """The whole trajectory ``name`` of ``server``'s library, in one signed request.

    Raises:
        ServerError: the server refused, signed (no such trajectory: the message lists them).
        WireError: the signed answer does not decode.
        RogueServer: only answers that failed verification came back (counted).
        RequestTimeout: no answer in time.
    """
    nonce = secrets.token_bytes(NONCE_SIZE)
    identity, replica = server.status.identity, server.keys.replica
    replies = await query(
        zsession, server.keys.trajectory, payload=encode(TrajectoryRequest(name, nonce)), timeout=timeout
    )
    genuine: bytes | None = None
    refusal: Rejection | None = None
    forged = 0
    for reply in replies:  # every one is looked at: each forgery is counted, wherever it came
        if reply.ok is not None:
            payload = reply.ok.payload.to_bytes()
            signature = b"" if reply.ok.attachment is None else reply.ok.attachment.to_bytes()
            transcript = trajectory_transcript(nonce, replica, name, payload)
            if len(signature) == SIGNATURE_SIZE and verify_signature(identity, transcript, signature):
                genuine = payload if genuine is None else genuine
                continue
        elif (rejection := rejection_of(reply)) is not None:
            transcript = rejection_transcript(nonce, replica, name, rejection.code, rejection.reason)
            if len(rejection.signature) == SIGNATURE_SIZE and verify_signature(
                identity, transcript, rejection.signature
            ):
                refusal = rejection
                continue
        else:
            continue  # Zenoh's own error replies (e.g. a timeout) say nothing
        forged += 1
        counters.reject("mac", f"trajectory {name!r}: an answer not signed by replica {replica}")
    if genuine is not None:
        return decode(genuine, Trajectory)
    if refusal is not None:
        raise ServerError(refusal.code, refusal.reason)
    if forged:
        raise RogueServer(f"trajectory {name!r}: {forged} answer(s) not signed by replica {replica}, none genuine")
    raise RequestTimeout(f"trajectory {name!r} not answered within {timeout:g} s")
