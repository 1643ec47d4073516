"""A replica's recent requests, for monitors: the ``<p>/audit`` queryable (`ServerKeys.audit`).

The server keeps the last requests of each client in memory, next to its audit log
(`servo.server.audit`), and answers an `AuditQuery` with an `AuditTail`. Behind a router only
monitors may ask (`servo.router.acl`). Like every body of the protocol an entry carries no
wall-clock instant: ``age_ms`` is how long before the reply the request was served, on the
server's monotonic clock. Entries join edge recordings and telemetry on (session_id, seq_id).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from servo.wire.messages import Name

#: Most entries one reply carries.
MAX_AUDIT_ENTRIES = 512

Millis = Annotated[float, msgspec.Meta(ge=0.0)]


class AuditQuery(msgspec.Struct, frozen=True):
    """Monitor -> server: the recent requests of one client (``client_id``), or of every client.

    ``errors_only`` keeps the requests that were not served (``outcome`` other than ``ok``).
    """

    client_id: Name = ""
    errors_only: bool = False
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_AUDIT_ENTRIES)] = 64


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
    """Server -> monitor: the replica's recent requests matching the query, oldest first."""

    replica: Name
    entries: Annotated[list[AuditEntry], msgspec.Meta(max_length=MAX_AUDIT_ENTRIES)] = []
