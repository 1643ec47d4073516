"""Server-side sessions and their latest-only observation mailboxes.

Zenoh's observation callback deposits into a session's mailbox (newest wins; what it replaces is
counted as superseded) and the inference worker takes from it. Control handlers on the event
loop open, reset and close sessions. One lock guards the registry; nothing slow ever runs under it.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import zenoh

from servo._core import Header
from servo.policy import Processor


#: Outcome of a deposit: queued, no session for the client, or from another epoch/old episode.
Deposit = Literal["ok", "no_session", "stale"]


@dataclass(frozen=True)
class Pending:
    """An observation waiting for inference: raw bytes, decoded only by the worker."""

    header: Header
    payload: bytes
    received_ns: int


@dataclass(frozen=True)
class Rejected:
    """Something arrived for the session that cannot be served; the worker answers with an error."""

    header: Header | None
    code: str
    message: str
    received_ns: int


@dataclass
class Session:
    """One client bound to this replica.

    Fields above the line are fixed at open; the mailbox fields are guarded by the registry
    lock; ``processor`` and ``needs_reset`` belong to the inference worker.
    """

    session_id: int
    client_id: str
    epoch: int
    task: str
    rtc: bool
    schema_version: int
    processor: Processor
    publisher: zenoh.Publisher
    opened_ns: int = field(default_factory=time.monotonic_ns)
    # --- guarded by SessionRegistry._lock
    episode_id: int = 0
    pending: Pending | Rejected | None = None
    superseded: int = 0
    needs_reset: bool = False
    served: int = 0
    errors: int = 0
    alive: bool = False


@dataclass(frozen=True)
class Work:
    """What the worker takes from a mailbox, atomically."""

    session: Session
    item: Pending | Rejected
    superseded: int
    reset: bool
    episode_id: int


class SessionRegistry:
    """All sessions of the replica, in ring order for the scheduler.

    Shared by the Zenoh callback threads (deposit), the event loop (open/reset/close) and the
    inference worker (take).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._sessions: dict[int, Session] = {}
        self._by_client: dict[str, int] = {}
        self._ring_after = -1
        self._ids = itertools.count(secrets.randbelow(1 << 31) << 16)
        self._closed = False
        self._alive_clients: set[str] = set()
        self.unknown_client_drops = 0
        self.stale_drops = 0

    def new_session_id(self) -> int:
        """A fresh id, unique within this server process and unlikely to collide across restarts."""
        return next(self._ids)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def snapshot(self) -> list[Session]:
        """Current sessions (the objects themselves; read-only use)."""
        with self._lock:
            return list(self._sessions.values())

    def get(self, session_id: int) -> Session | None:
        """Session by id."""
        with self._lock:
            return self._sessions.get(session_id)

    def by_client(self, client_id: str) -> Session | None:
        """Session of a client, if any."""
        with self._lock:
            sid = self._by_client.get(client_id)
            return None if sid is None else self._sessions.get(sid)

    def add(self, session: Session) -> Session | None:
        """Register a session; returns the client's previous session, which it replaces."""
        with self._lock:
            old_id = self._by_client.get(session.client_id)
            old = self._sessions.pop(old_id, None) if old_id is not None else None
            # The client's liveliness token usually arrives before its session-open query.
            session.alive = session.client_id in self._alive_clients
            self._sessions[session.session_id] = session
            self._by_client[session.client_id] = session.session_id
            return old

    def remove(self, session_id: int) -> Session | None:
        """Drop a session; returns it if it existed."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
            if session is not None and self._by_client.get(session.client_id) == session_id:
                del self._by_client[session.client_id]
            return session

    def set_alive(self, client_id: str, alive: bool) -> Session | None:
        """Record the client's liveliness token state; returns its session if any."""
        with self._lock:
            if alive:
                self._alive_clients.add(client_id)
            else:
                self._alive_clients.discard(client_id)
            sid = self._by_client.get(client_id)
            session = None if sid is None else self._sessions.get(sid)
            if session is not None:
                session.alive = alive
            return session

    def reset(self, session_id: int, episode_id: int) -> bool:
        """Episode boundary: drop the pending observation, move to ``episode_id``."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return False
            # An observation of the new episode may overtake the reset request; keep it.
            pending = session.pending
            if pending is not None and (
                pending.header is None or pending.header.episode_id < episode_id
            ):
                session.pending = None
            session.episode_id = max(session.episode_id, episode_id)
            session.needs_reset = True
            return True

    def deposit(self, client_id: str, item: Pending | Rejected) -> Deposit:
        """Called from the Zenoh callback thread: newest observation wins.

        Observations of another session epoch or an older episode are dropped (a reconnected
        client's stragglers must not be served into its new session).
        """
        with self._lock:
            sid = self._by_client.get(client_id)
            session = None if sid is None else self._sessions.get(sid)
            if session is None:
                self.unknown_client_drops += 1
                return "no_session"
            header = item.header
            if header is not None and (
                header.session_epoch != session.epoch or header.episode_id < session.episode_id
            ):
                self.stale_drops += 1
                return "stale"
            if session.pending is not None:
                session.superseded += 1
            session.pending = item
            self._ready.notify()
            return "ok"

    def wait_work(self, timeout: float) -> list[Session]:
        """Worker: block until some session has a pending item (or timeout); ring-ordered."""
        with self._lock:
            if not self._ready.wait_for(lambda: self._closed or self._any_pending(), timeout):
                return []
            if self._closed:
                return []
            return list(self._ring_order())

    def take(self, session: Session) -> Work | None:
        """Worker: atomically take the session's pending item and its superseded count."""
        with self._lock:
            item = session.pending
            if item is None or self._sessions.get(session.session_id) is not session:
                return None
            work = Work(session, item, session.superseded, session.needs_reset, session.episode_id)
            session.pending = None
            session.superseded = 0
            session.needs_reset = False
            self._ring_after = session.session_id
            return work

    def close(self) -> None:
        """Stop handing out work; wakes a waiting worker."""
        with self._lock:
            self._closed = True
            self._ready.notify_all()

    def _any_pending(self) -> bool:
        return any(s.pending is not None for s in self._sessions.values())

    def _ring_order(self) -> Iterator[Session]:
        ids = list(self._sessions)
        start = 0
        if self._ring_after in self._sessions:
            start = ids.index(self._ring_after) + 1
        for sid in ids[start:] + ids[:start]:
            session = self._sessions[sid]
            if session.pending is not None:
                yield session
