"""One structured JSON line per served request (docs/design/audit.md §1), and the recent ones in memory.

Lines join with edge recordings on (session_id, seq_id). The last requests of each client are
also kept in memory (`RecentRequests`, bounded) for monitors, which ask the replica's ``audit``
queryable (`servo.wire.audit`) instead of reading its disk.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import IO, Any

import structlog

from servo.private_files import private_opener
from servo.wire import AuditEntry, AuditQuery

#: Requests kept per client; clients kept of those nobody enrolled (the least recently served is
#: forgotten first), and of enrolled robots (never displaced by the others).
RECENT_PER_CLIENT = 128
RECENT_CLIENTS = 1024
RECENT_ENROLLED = 4096


class RecentRequests:
    """The last `RECENT_PER_CLIENT` requests of the clients served, and which robot key each served.

    Two pools: enrolled robots' (up to `RECENT_ENROLLED`) and everybody else's (the last
    `RECENT_CLIENTS`, least recently served forgotten first). A flood of throw-away identities
    only ever displaces its own kind: an enrolled robot's history stays. Each row keeps the robot
    key of the session that made it, so a robot reads only the rows its own key made
    (`servo.server.audit_door`).

    Written by the inference worker and reply threads, read by the event loop (the audit
    queryable); one lock, held for O(1) work or one copy of the rows asked for. Each client's
    refused requests are counted, so the query monitors repeat every few seconds (every client's
    refusals) skips the clients that have none instead of sorting every request kept.
    """

    def __init__(
        self, per_client: int = RECENT_PER_CLIENT, clients: int = RECENT_CLIENTS, enrolled: int = RECENT_ENROLLED
    ) -> None:
        self._per_client = per_client
        self._caps = {False: clients, True: enrolled}
        self._lock = threading.Lock()
        #: Per pool (enrolled or not): client id -> its requests, oldest first.
        self._pools: dict[bool, OrderedDict[str, _Ring]] = {False: OrderedDict(), True: OrderedDict()}

    def add(
        self, entry: AuditEntry, now_ns: int | None = None, *, robot_key: bytes = b"", enrolled: bool = False
    ) -> None:
        """Remember one request (``age_ms`` is filled in when asked) and the robot key that made it."""
        stamp = time.monotonic_ns() if now_ns is None else now_ns
        pool = self._pools[enrolled]
        with self._lock:
            ring = pool.get(entry.client_id)
            if ring is None:
                ring = pool[entry.client_id] = _Ring(deque(maxlen=self._per_client))
                if len(pool) > self._caps[enrolled]:
                    pool.popitem(last=False)
            else:
                pool.move_to_end(entry.client_id)
            ring.append(stamp, entry, robot_key)

    def robot_keys(self, client_id: str) -> set[bytes]:
        """The robot keys whose requests are kept under ``client_id``."""
        with self._lock:
            return {key for pool in self._pools.values() if (ring := pool.get(client_id)) for key in ring.keys}

    def tail(self, query: AuditQuery, now_ns: int | None = None, *, robot_key: bytes | None = None) -> list[AuditEntry]:
        """The newest ``query.limit`` matching requests, oldest first, with their age.

        With ``robot_key``, only the rows that key made (what a robot may read of its own).
        """
        now = time.monotonic_ns() if now_ns is None else now_ns
        errors = query.errors_only
        with self._lock:
            if query.client_id:
                rings = [ring for pool in self._pools.values() if (ring := pool.get(query.client_id))]
            else:
                rings = [ring for pool in self._pools.values() for ring in pool.values() if ring.refused or not errors]
            rows = [
                row
                for ring in rings
                for row in ring.rows
                if (not errors or row[1].outcome != "ok") and (robot_key is None or row[2] == robot_key)
            ]
        if len(rings) > 1:
            rows.sort(key=lambda row: row[0])
        return [_aged(entry, now - stamp) for stamp, entry, _ in rows[-query.limit :]]


@dataclass
class _Ring:
    """One client's recent requests, how many were refused, and how many rows each robot key made.

    A row is (monotonic ns served, the entry with age 0, the robot key of its session).
    """

    rows: deque[tuple[int, AuditEntry, bytes]]
    refused: int = 0
    keys: dict[bytes, int] = field(default_factory=dict)

    def append(self, stamp: int, entry: AuditEntry, robot_key: bytes) -> None:
        if len(self.rows) == self.rows.maxlen:
            _, oldest, key = self.rows[0]
            self.refused -= oldest.outcome != "ok"
            self.keys[key] -= 1
            if not self.keys[key]:
                del self.keys[key]
        self.rows.append((stamp, entry, robot_key))
        self.refused += entry.outcome != "ok"
        self.keys[robot_key] = self.keys.get(robot_key, 0) + 1


def _aged(entry: AuditEntry, age_ns: int) -> AuditEntry:
    return AuditEntry(
        entry.client_id,
        entry.session_id,
        entry.seq_id,
        entry.episode_id,
        entry.outcome,
        entry.queue_wait_ms,
        entry.inference_ms,
        entry.staleness_ms,
        entry.superseded,
        max(0, age_ns) / 1e6,
    )


class AuditLog:
    """Appends JSON lines to a file (or stdout for ``"-"``; disabled for ``""``) and to ``recent``.

    Written from the reply thread (`servo.server.replies`; the underlying WriteLogger serialises
    lines under a lock); closed by the event loop once it has stopped.
    """

    def __init__(self, path: str, recent: RecentRequests | None = None) -> None:
        self.recent = RecentRequests() if recent is None else recent
        self._file: IO[str] | None = None
        if not path:
            self._log = None
            return
        # Every robot's requests: created readable by this user alone.
        self._file = sys.stdout if path == "-" else open(path, "a", buffering=1, opener=private_opener)  # noqa: SIM115
        # An explicit, non-filtering wrapper: the audit trail must not follow the console log
        # level (`--log-level warning` would otherwise drop every line, `msg` being `info`).
        self._log = structlog.wrap_logger(
            structlog.WriteLogger(self._file),
            processors=[
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.JSONRenderer(),
            ],
            wrapper_class=structlog.BoundLogger,
        )

    def write(
        self,
        *,
        session_id: str,
        client_id: str,
        seq_id: int,
        episode_id: int,
        queue_wait_ms: float,
        inference_ms: float,
        staleness_ms: float,
        outcome: str,
        superseded: int = 0,
        robot_key: bytes = b"",
        enrolled: bool = False,
        **extra: Any,
    ) -> None:
        """Write one line (``extra`` fields go to the file only) and remember the request.

        ``robot_key`` signed the session that made the request, ``enrolled`` whether the replica
        enrolled it (`RecentRequests`).
        """
        fields = {
            "session_id": session_id,
            "client_id": client_id,
            "seq_id": seq_id,
            "episode_id": episode_id,
            "queue_wait_ms": round(queue_wait_ms, 3),
            "inference_ms": round(inference_ms, 3),
            "staleness_ms": round(staleness_ms, 3),
            "superseded": superseded,
        }
        self.recent.add(
            AuditEntry(
                client_id,
                session_id,
                seq_id,
                episode_id,
                outcome,
                max(0.0, queue_wait_ms),
                max(0.0, inference_ms),
                max(0.0, staleness_ms),
                superseded,
                0.0,
            ),
            robot_key=robot_key,
            enrolled=enrolled,
        )
        if self._log is not None:
            self._log.msg("request", **fields, **extra, outcome=outcome)

    def close(self) -> None:
        """Flush and close the file."""
        if self._file is not None and self._file is not sys.stdout:
            self._file.close()
        self._file = None
        self._log = None
