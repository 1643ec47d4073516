"""Server-side sessions and their latest-only observation mailboxes.

Zenoh's observation callback authenticates an observation (`servo.server.auth`) and deposits it
into its session's mailbox (newest wins; what it replaces is counted as superseded). A raw
observation is decoded by the decoder thread, which puts it back as ready; the inference worker
takes ready items. Control handlers on the event loop open, reset and close sessions. One lock
guards the registry; nothing slow ever runs under it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import zenoh

from servo._core import Header
from servo.policy import DecodedObservation, Processor
from servo.server.admission import ImageGate, TokenBucket
from servo.server.auth import SessionAuth
from servo.wire import reply_header

#: Outcome of a deposit: queued, the session is gone (replaced, closed), or an old episode's.
Deposit = Literal["ok", "session", "stale"]


@dataclass(frozen=True)
class Pending:
    """A raw, authenticated observation waiting to be decoded.

    The body is already copied out of Zenoh: its MAC had to be checked before it could enter
    the mailbox.
    """

    header: Header
    payload: bytes
    received_ns: int


@dataclass(frozen=True)
class Decoded:
    """A decoded observation waiting for inference; ``decode_ns`` is what decoding took."""

    header: Header
    obs: DecodedObservation
    delay: int
    received_ns: int
    decode_ns: int


@dataclass(frozen=True)
class Rejected:
    """An authenticated observation that cannot be served; the worker answers with an error."""

    header: Header
    code: str
    message: str
    received_ns: int


@dataclass
class Session:
    """One client bound to this replica.

    Fields above the line are fixed at open (``auth`` keeps its own lock); the mailbox fields
    are guarded by the registry lock; ``processor`` belongs to the inference worker. The
    publisher is shared by the worker (chunks, errors) and the event loop (drain notice,
    undeclare): use `publish` and `close_publisher`, which serialise the two (a Zenoh publisher
    used from two threads at once raises ``RuntimeError: Already borrowed``). Every message it
    publishes is sealed with the session key.
    """

    auth: SessionAuth
    client_id: str
    task: str
    rtc: bool
    schema_version: int
    processor: Processor
    publisher: zenoh.Publisher
    #: Checks each observation's frame sizes before its mailbox (`servo.server.admission`).
    images: ImageGate
    #: Authenticated observations this session may still send (Zenoh callback threads).
    observations: TokenBucket
    opened_ns: int = field(default_factory=time.monotonic_ns)
    # --- guarded by SessionRegistry._lock
    episode_id: int = 0
    raw: Pending | None = None  # waiting for the decoder
    queued: bool = False  # in the registry's decode queue (at most once)
    pending: Decoded | Rejected | None = None  # waiting for the worker
    decoding: bool = False
    generation: int = 0  # bumped by every deposit: a decode of an older one is discarded
    decode_generation: int = 0
    superseded: int = 0
    needs_reset: bool = False
    # Worker-owned: the episode of the last observation served. -1 (none yet) makes a session's
    # first observation an episode start, so a chunk-stateful policy forgets the previous session.
    served_episode: int = -1
    served: int = 0
    errors: int = 0
    alive: bool = False
    #: The client's liveliness token vanished at least once since the open: whoever holds the
    #: name now (a token under it again) may be a restarted client (see `servo.server.auth.takeover`).
    token_lost: bool = False
    # --- guarded by _publish_lock
    _publish_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _publisher_closed: bool = False

    @property
    def session_id(self) -> str:
        """The session id: 32 lowercase hex characters (16 random bytes on the wire)."""
        return self.auth.session_id

    @property
    def epoch(self) -> int:
        """The session epoch the client chose at open."""
        return self.auth.epoch

    def publish(self, msg_type: int, body: bytes, request: Header | None = None) -> bool:
        """Seal one message with the session key and put it on the session's action key.

        The header answers ``request`` (see `reply_header`); without one (a drain notice) it
        addresses the session's current episode. Returns False once the publisher is closed.
        """
        if request is None:
            request = Header(self.schema_version, msg_type, 0, 0, self.episode_id, self.epoch, 0, self.auth.wire_id)
        header = reply_header(request, msg_type, schema_version=self.schema_version)
        attachment = self.auth.key.seal(header, body)
        with self._publish_lock:
            if self._publisher_closed:
                return False
            try:
                self.publisher.put(body, attachment=attachment)
            except zenoh.ZError:
                return False
            return True

    def close_publisher(self) -> None:
        """Undeclare the publisher (idempotent); waits for a put in progress on another thread."""
        with self._publish_lock:
            if self._publisher_closed:
                return
            self._publisher_closed = True
            with contextlib.suppress(zenoh.ZError):
                self.publisher.undeclare()


@dataclass(frozen=True)
class Work:
    """What the worker takes from a mailbox, atomically."""

    session: Session
    item: Decoded | Rejected
    superseded: int
    reset: bool
    episode_id: int


class SessionRegistry:
    """All sessions of the replica, in ring order for the scheduler.

    Shared by the Zenoh callback threads (deposit), the event loop (open/reset/close), the
    decoder thread (wait_raw/finish_decode) and the inference worker (wait_work/take). Sessions
    are keyed by their hex session id.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._raw_ready = threading.Condition(self._lock)
        self._raw_queue: deque[Session] = deque()
        self._worker_idle = False
        self._sessions: dict[str, Session] = {}
        self._by_client: dict[str, str] = {}
        self._ring_after = ""
        self._closed = False
        self._alive_clients: set[str] = set()
        self.stale_drops = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def snapshot(self) -> list[Session]:
        """Current sessions (the objects themselves; read-only use)."""
        with self._lock:
            return list(self._sessions.values())

    def get(self, session_id: str) -> Session | None:
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

    def remove(self, session_id: str) -> Session | None:
        """Drop a session; returns it if it existed."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
            if session is not None and self._by_client.get(session.client_id) == session_id:
                del self._by_client[session.client_id]
            return session

    def holder_present(self, session: Session) -> bool:
        """Whether the client that opened ``session`` is still there: its token never vanished since."""
        with self._lock:
            return session.client_id in self._alive_clients and not session.token_lost

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
                session.token_lost = session.token_lost or not alive
            return session

    def reset(self, session_id: str, episode_id: int) -> bool:
        """Episode boundary: drop the pending observation, move to ``episode_id``."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return False
            # An observation of the new episode may overtake the reset request; keep it. One of
            # the old episode being decoded right now is discarded when the decode finishes.
            raw = session.raw
            if raw is not None and raw.header.episode_id < episode_id:
                session.raw = None
            pending = session.pending
            if pending is not None and pending.header.episode_id < episode_id:
                session.pending = None
            session.episode_id = max(session.episode_id, episode_id)
            # If an observation of this episode was already served, the worker reset then.
            session.needs_reset = session.needs_reset or episode_id > session.served_episode
            return True

    def deposit(self, session: Session, item: Pending) -> Deposit:
        """Called from the Zenoh callback thread with an authenticated observation: newest wins.

        Dropped when ``session`` was closed or replaced since it was authenticated, or when the
        observation belongs to an older episode (a straggler of before a reset).
        """
        with self._lock:
            if self._sessions.get(session.session_id) is not session:
                return "session"
            if item.header.episode_id < session.episode_id:
                self.stale_drops += 1
                return "stale"
            if session.raw is not None or session.pending is not None or session.decoding:
                session.superseded += 1
            session.generation += 1
            session.raw, session.pending = item, None
            if not session.queued:
                session.queued = True
                self._raw_queue.append(session)
            # An idle worker decodes it itself; a busy one leaves it to the decoder thread.
            (self._ready if self._worker_idle else self._raw_ready).notify()
            return "ok"

    def wait_raw(self, timeout: float) -> tuple[Session, Pending] | None:
        """Decoder: take a raw observation, waiting for one while the worker is busy.

        Returns None on timeout or close. An idle worker decodes for itself (`take_raw`): one
        thread hop less on the request's path.
        """
        with self._lock:
            while True:
                if not self._worker_idle:
                    taken = self._pop_raw()
                    if taken is not None:
                        return taken
                if self._closed or not self._raw_ready.wait(timeout):
                    return None

    def take_raw(self) -> tuple[Session, Pending] | None:
        """Worker, when it has nothing decoded to serve: take a raw observation to decode itself."""
        with self._lock:
            return self._pop_raw()

    def _pop_raw(self) -> tuple[Session, Pending] | None:
        while self._raw_queue:
            session = self._raw_queue.popleft()
            session.queued = False
            item = session.raw
            if item is None or self._sessions.get(session.session_id) is not session:
                continue  # superseded by a rejection, reset or closed meanwhile
            session.raw = None
            session.decoding = True
            session.decode_generation = session.generation
            return session, item
        return None

    def finish_decode(self, session: Session, item: Pending, result: Decoded | Rejected | None) -> None:
        """Decoder: hand a decoded observation to the worker.

        Unless it lost its place meanwhile: a newer observation arrived, the episode was reset,
        or the session was closed.
        """
        with self._lock:
            session.decoding = False
            if result is None or self._sessions.get(session.session_id) is not session:
                return
            if session.generation != session.decode_generation:
                return  # superseded while decoding (counted when the newer one arrived)
            if item.header.episode_id < session.episode_id:
                self.stale_drops += 1
                return
            session.pending = result
            self._ready.notify()

    def has_work(self) -> bool:
        """Whether some session has an observation waiting (decoded or not)."""
        with self._lock:
            return self._any_pending() or self._any_raw()

    def wait_work(self, timeout: float) -> list[Session]:
        """Worker: block until some session has a pending item (or timeout); ring-ordered.

        Also returns (with an empty list) when a raw observation arrives while nothing is
        decoded: the worker then decodes it itself with `take_raw`.
        """
        with self._lock:
            self._worker_idle = True
            try:
                ready = self._ready.wait_for(lambda: self._closed or self._any_pending() or self._any_raw(), timeout)
            finally:
                self._worker_idle = False
            if not ready or self._closed:
                return []
            if not self._any_pending():
                return []
            # Busy from here on: raw observations still queued are the decoder's.
            if self._any_raw():
                self._raw_ready.notify()
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

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._closed

    def close(self) -> None:
        """Stop handing out work; wakes a waiting worker and decoder."""
        with self._lock:
            self._closed = True
            self._ready.notify_all()
            self._raw_ready.notify_all()

    def _any_raw(self) -> bool:
        return any(s.raw is not None for s in self._raw_queue)

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
