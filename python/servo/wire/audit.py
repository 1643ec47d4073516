"""A replica's recent requests, for operators and for each robot: the ``<p>/audit`` queryable (`ServerKeys.audit`).

The server keeps the last requests of each client in memory, next to its audit log
(`servo.server.audit`), and answers an `AuditQuery` with an `AuditTail`. Who asks proves it: the
query is signed by the asker's Ed25519 identity (`audit_transcript`: the question, the
replica's key prefix and a nonce its status handed out lately, so a captured query goes stale)
and carries an ephemeral X25519 key the answer is sealed to (`servo.wire.sealed`,
`AUDIT_CONTEXT`): an operator (``[security] operators``, a fleet's ``[[monitors]]``) reads the
fleet's rows and the replica's enrolled robots; a robot reads the rows its own key made; anybody
else is refused before any signature is checked (`servo.server.audit_door`). Behind a router only
monitors may ask at all (`servo.router.acl`).

Like every body of the protocol an entry carries no wall-clock instant: ``age_ms`` is how long
before the reply the request was served, on the server's monotonic clock. Entries join edge
recordings and telemetry on (session_id, seq_id).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from servo.wire.messages import Name, Nonce, OptionalPublicKey, OptionalSignature, PublicKey

#: Most entries one reply carries, and most enrolled robots it names.
MAX_AUDIT_ENTRIES = 512
MAX_ROSTER = 4096
#: What an audit query's asker signs (`audit_transcript`), and the context of the sealed answer.
AUDIT_QUERY_CONTEXT = b"servo/3 audit-query\0"
AUDIT_CONTEXT = b"servo/3 sealed-audit\0"

Millis = Annotated[float, msgspec.Meta(ge=0.0)]


class AuditQuery(msgspec.Struct, frozen=True):
    """Operator or robot -> server: the recent requests of one client (``client_id``), or of every client.

    ``errors_only`` keeps the requests that were not served (``outcome`` other than ``ok``).
    ``asker`` is the Ed25519 identity that signs the query (``signature`` over `audit_transcript`),
    ``nonce`` one the replica's status handed out, ``reply_key`` the ephemeral X25519 key the
    answer is sealed to.
    """

    client_id: Name = ""
    errors_only: bool = False
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_AUDIT_ENTRIES)] = 64
    asker: OptionalPublicKey = b""
    reply_key: OptionalPublicKey = b""
    nonce: Nonce = b""
    signature: OptionalSignature = b""


def audit_transcript(query: AuditQuery, prefix: str) -> bytes:
    """What an audit query's asker signs: every field but the signature, for the replica at ``prefix``."""
    fields = [prefix, query.client_id, query.errors_only, query.limit, query.asker, query.reply_key, query.nonce]
    return AUDIT_QUERY_CONTEXT + msgspec.msgpack.encode(fields)


def audit_question(query: AuditQuery, replica: str) -> list[object]:
    """The question a sealed audit answer is bound to (`servo.wire.sealed`)."""
    return [replica, query.asker, query.reply_key, query.client_id, query.errors_only, query.limit, query.nonce]


class AuditEntry(msgspec.Struct, frozen=True, array_like=True):
    """One served (or refused) request, as the audit log wrote it.

    ``staleness_ms`` is how old the observation was when its chunk left (arrival to publish,
    on the server's clock); ``age_ms`` how long ago that was when the reply was built.
    """

    client_id: Name
    session_id: Annotated[str, msgspec.Meta(max_length=32)]
    seq_id: Annotated[int, msgspec.Meta(ge=0)]
    episode_id: Annotated[int, msgspec.Meta(ge=0)]
    outcome: Name
    queue_wait_ms: Millis
    inference_ms: Millis
    staleness_ms: Millis
    superseded: Annotated[int, msgspec.Meta(ge=0)]
    age_ms: Millis


class AuditTail(msgspec.Struct, frozen=True):
    """Server -> asker (sealed): the replica's recent requests matching the query, oldest first.

    ``robots`` (operators only): the robots the replica enrolled, name to Ed25519 key; a monitor
    trusts their telemetry keys from it when the answer's signature is a trusted replica's.
    """

    replica: Name
    entries: Annotated[list[AuditEntry], msgspec.Meta(max_length=MAX_AUDIT_ENTRIES)] = []
    robots: Annotated[dict[Name, PublicKey], msgspec.Meta(max_length=MAX_ROSTER)] = {}
