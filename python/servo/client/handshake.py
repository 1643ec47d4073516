"""The session open, from the client's side: one X25519 exchange, signed by the robot, verified.

`handshake` completes a `SessionOpen` (a fresh X25519 key, the resume proof of the previous
session, the robot's signature over it with the replica's status nonce: `servo.client.trust`),
sends it on the session's own key, accepts only an ack signed by the identity trusted for the
replica (`servo.client.trust.pick_ack`), and gives the session its key. A status older than its
nonce's validity (``stale_nonce``: the replica hands out a new one every 30 s) is asked again
once, from the same replica under the same identity, and the open sent again.
"""

from __future__ import annotations

import msgspec
import zenoh

from servo._core import KeyPair
from servo.client.discovery import ServerInfo
from servo.client.errors import RequestTimeout, SessionRejected
from servo.client.session import RemoteSession
from servo.client.trust import pick_ack, signed_open
from servo.client.verify import ClientCounters
from servo.identity import Identity
from servo.join import JoinToken
from servo.transport import query
from servo.wire import MAX_STATUS_BYTES, SessionAck, SessionOpen, StatusReply, WireError, decode, encode


async def handshake(
    zsession: zenoh.Session,
    session: RemoteSession,
    request: SessionOpen,
    *,
    identity: Identity,
    counters: ClientCounters,
    previous: RemoteSession | None,
    timeout: float,
    join: JoinToken | None = None,
) -> SessionAck:
    """Open ``session`` (declared, not yet open) with ``request``; its ack once the key is shared.

    ``request``'s X25519 key, resume proof and signature are filled in here; ``previous`` is
    this client's previous session on the same replica, whose key proves it held it; ``join``
    a join token whose proof the open carries (`servo.join`).

    Raises:
        SessionRejected: the server refused; ``.rejection.code`` names the failed rule.
        RogueServer: only forged or unverifiable acks came back (counted, never used).
        RequestTimeout: the server did not answer.
    """
    server, retried = session.server, False
    while True:
        pair = KeyPair()
        resume = b"" if previous is None else previous.protocol.resume_proof(pair.public_key)
        opening = msgspec.structs.replace(request, client_key=pair.public_key, resume=resume)
        opening = signed_open(opening, identity, prefix=server.keys.prefix, nonce=server.status.nonce, join=join)
        replies = await query(zsession, session.keys.session, payload=encode(opening), timeout=timeout)
        try:
            ack = pick_ack(
                replies,
                keys=server.keys,
                status=server.status,
                client_key=pair.public_key,
                counters=counters,
                timeout=timeout,
            )
        except SessionRejected as exc:
            if exc.rejection.code != "stale_nonce" or retried:
                raise
            server, retried = await _fresh_status(zsession, server, timeout), True
            continue
        session.server = server
        key = pair.session_key(
            ack.server_key, client_public=pair.public_key, server_public=ack.server_key, session_id=ack.session_id
        )
        session.protocol.established(ack, key)
        await session.wait_matched(timeout)
        return ack


async def _fresh_status(zsession: zenoh.Session, server: ServerInfo, timeout: float) -> ServerInfo:
    """``server`` as its status says now, under the identity it was trusted with.

    Raises:
        RequestTimeout: it no longer answers (as that identity).
    """
    for reply in await query(zsession, server.keys.status, timeout=timeout):
        if reply.ok is None:
            continue
        try:
            status = decode(reply.ok.payload.to_bytes(), StatusReply, max_bytes=MAX_STATUS_BYTES)
        except WireError:
            continue
        if status.identity == server.status.identity and status.replica == server.keys.replica:
            return ServerInfo(server.keys, status)
    raise RequestTimeout(f"replica {server.keys.replica} no longer answers its status")
