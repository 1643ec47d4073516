"""Fetching a trajectory from a server's library, believing only the server's own answer.

The request is signed by the robot's identity under its client id, as a session open is (the
replica lets in only the robots its admission rule admits: `servo.wire.trajectory`), and carries
a fresh random nonce and an ephemeral X25519 key; the replica encrypts its answer to that key
(nobody on the link reads the trajectory) and signs it, or its refusal, over the nonce, its
replica id and the name asked for (`servo.wire.sealed`, `servo.wire.trust.rejection_transcript`).
An answer is believed only if the signature verifies under the identity discovery trusted for
that replica (pins or known servers, as for a session ack), and only then decrypted: anybody
else's trajectory, a replay of an old one, or a forged refusal is dropped and counted
(``chunks_rejected["mac"]``), never executed or obeyed.
"""

from __future__ import annotations

import secrets
from typing import Protocol

import msgspec
import zenoh

from servo._core import SIGNATURE_SIZE, KeyPair, verify_signature
from servo.client.discovery import ServerInfo
from servo.client.errors import RequestTimeout, RogueServer, ServerError
from servo.client.replies import rejection_of
from servo.client.verify import ClientCounters
from servo.identity import Identity
from servo.transport import query
from servo.wire import (
    NONCE_SIZE,
    TRAJECTORY_CONTEXT,
    Rejection,
    Trajectory,
    TrajectoryRequest,
    decode,
    encode,
    rejection_transcript,
    trajectory_request_transcript,
)
from servo.wire.sealed import open_reply, signed_by


class Robot(Protocol):
    """Who asks: a robot's client id and the identity it signs with (a `PolicyClient`)."""

    client_id: str
    identity: Identity


async def fetch_trajectory(
    zsession: zenoh.Session,
    server: ServerInfo,
    name: str,
    *,
    robot: Robot,
    counters: ClientCounters,
    timeout: float,
) -> Trajectory:
    """The whole trajectory ``name`` of ``server``'s library, asked for by ``robot``.

    Raises:
        ServerError: the server refused, signed (no such trajectory: the message lists them; a
            robot it does not admit: ``unauthenticated``).
        WireError: the signed answer does not decrypt or decode.
        RogueServer: only answers that failed verification came back (counted).
        RequestTimeout: no answer in time.
    """
    nonce, pair = secrets.token_bytes(NONCE_SIZE), KeyPair()
    identity, replica = server.status.identity, server.keys.replica
    request = TrajectoryRequest(name, nonce, pair.public_key, robot.client_id, robot.identity.public_key)
    signature = robot.identity.sign(trajectory_request_transcript(request, server.keys.prefix))
    request = msgspec.structs.replace(request, signature=signature)
    replies = await query(zsession, server.keys.trajectory, payload=encode(request), timeout=timeout)
    genuine: tuple[bytes, bytes] | None = None
    refusal: Rejection | None = None
    forged = 0
    for reply in replies:  # every one is looked at: each forgery is counted, wherever it came
        if reply.ok is not None:
            payload = reply.ok.payload.to_bytes()
            proof = b"" if reply.ok.attachment is None else reply.ok.attachment.to_bytes()
            if signed_by(identity, payload, proof, context=TRAJECTORY_CONTEXT, question=[nonce, replica, name]):
                genuine = (payload, proof) if genuine is None else genuine
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
        return decode(open_reply(pair, nonce, *genuine), Trajectory)
    if refusal is not None:
        raise ServerError(refusal.code, refusal.reason)
    if forged:
        raise RogueServer(f"trajectory {name!r}: {forged} answer(s) not signed by replica {replica}, none genuine")
    raise RequestTimeout(f"trajectory {name!r} not answered within {timeout:g} s")
