"""Server-side sessions and their newest-wins observation mailboxes.

Zenoh's observation callback authenticates and decodes an observation (`servo.server.intake`)
and deposits it into its session's mailbox; the inference worker takes mailboxes and claims each
item right before serving it. Control handlers on the event loop open, reset and close
sessions. One lock guards the registry; nothing slow ever runs under it.

A session's mailbox (``mailbox``: the newest decoded observation; ``held``: the worker holds one
it took and has not claimed yet)::

               deposit                 take                  claim
    ┌───────┐ ────────► ┌──────┐ ─────────────► ┌──────┐ ─────────────────► empty: served
    │ empty │           │ full │                │ held │ ── claim refused ─► empty: its episode
    └───────┘ ◄──────── └──────┘                └──────┘    (not served)      was reset, or the
               reset:     │  ▲                     │                         session closed
               older      └──┘ deposit: newest     │ deposit
               episode         wins, superseded+1  ▼
                                               ┌─────────────┐  claim: the newer one is served
                                               │ held + full │ ────────────────► in the held one's
                                               └─────────────┘  place, superseded+1      turn

Every deposit that replaces a waiting or held observation counts one ``superseded``, reported
with the next chunk served. A newer observation that arrives while the worker holds an older
one takes the older one's turn (it is served instead, at claim): newest wins without sending
the session to the back of the queue. Deposits of an older episode than the session's are
dropped (``stale``), and so is an item whose episode was reset meanwhile.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import zenoh

from servo._core import AuthError, Header
from servo.policy import DecodedObservation, Processor
from servo.server.admission import ImageGate, TokenBucket
from servo.server.auth import SessionAuth
from servo.server.copies import Answer, CopyBook
from servo.wire import reply_header

#: Outcome of a deposit: queued, the session is gone (replaced, closed), or an old episode's.
Deposit = Literal["ok", "session", "stale"]


@dataclass(frozen=True)
class Decoded:
    """A decoded observation waiting for inference.

    ``received_ns``: when its message reached the server; ``ready_ns``: when it was authenticated
    and decoded, ready for the device (queue wait counts from there); ``decode_ns``: what
    decoding took.
    """

    header: Header
    obs: DecodedObservation
    delay: int
    received_ns: int
    decode_ns: int
    ready_ns: int


@dataclass(frozen=True)
class Rejected:
    """An authenticated observation that cannot be served; the worker answers with an error."""

    header: Header
    code: str
    message: str
    received_ns: int


#: What a mailbox holds: an observation ready for the device, or one to answer with an error.
Mail = Decoded | Rejected


@dataclass(frozen=True)
class Claim:
    """What the worker learns when it claims a held observation for serving.

    ``item`` is what to serve: the held observation, or a newer one of the session that arrived
    meanwhile and takes its turn.
    """

    item: Mail
    superseded: int
    reset: bool


@dataclass
class Session:
    """One client bound to this replica.

    Fields above the line are fixed at open (``auth`` keeps its own lock); the mailbox and
    liveliness fields are guarded by the registry lock (see the module's diagram); ``processor``
    belongs to the inference worker. The publisher is shared by the worker (chunks, errors) and
    the event loop (drain notice, undeclare): use `publish` and `close_publisher`, which
    serialise the two (a Zenoh publisher used from two threads at once raises ``RuntimeError:
    Already borrowed``). Every message it publishes is encrypted with the session key.
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
    #: Set by the observation thread at the first authenticated observation: the robot key is
    #: then a returning one (`servo.server.admission.ReturningRobots`).
    streamed: bool = False
    #: Opened by one of the server's frontends (the openpi door), with the replica's own key: it
    #: counts against that door's capacity, never the robots' (`SessionRegistry.robots`).
    frontend: bool = False
    # --- guarded by SessionRegistry._lock
    episode_id: int = 0
    mailbox: Mail | None = None
    held: bool = False
    superseded: int = 0
    needs_reset: bool = False
    #: The request being served and the latest answer, for copies (`servo.server.copies`).
    copies: CopyBook = field(default_factory=CopyBook)
    # Worker-owned: the episode of the last observation served. -1 (none yet) makes a session's
    # first observation an episode start, so a chunk-stateful policy forgets the previous session.
    served_episode: int = -1
    #: The client's liveliness token vanished at least once since the open: whoever holds the
    #: name now (a token under it again) may be a restarted client (see `servo.server.auth.takeover`).
    token_lost: bool = False
    #: The replica enrolled the robot key that opened it under this client id (its audit rows
    #: are never displaced by those of robots nobody enrolled: `servo.server.audit.RecentRequests`).
    enrolled: bool = False
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
        """Encrypt one message with the session key and put it on the session's action key.

        The header answers ``request`` (see `reply_header`); without one (a drain notice) it
        addresses the session's current episode. Returns False once the publisher is closed, or
        when the key refuses the message: a second answer of its type to a request older than
        one already answered would repeat a nonce (`servo._core.SessionKey`), and the client
        takes only the answer to its latest request anyway.
        """
        if request is None:
            request = Header(self.schema_version, msg_type, 0, 0, self.episode_id, self.epoch, 0, self.auth.wire_id)
        header = reply_header(request, msg_type, schema_version=self.schema_version)
        try:
            attachment, ciphertext = self.auth.key.encrypt(header, body)
        except AuthError:
            return False
        with self._publish_lock:
            if self._publisher_closed:
                return False
            try:
                self.publisher.put(ciphertext, attachment=attachment)
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


class SessionRegistry:
    """All sessions of the replica, in ring order for the scheduler.

    Shared by the Zenoh callback threads (deposit), the event loop (open/reset/close) and the
    inference worker (wait_ready/take/claim). Sessions are keyed by their hex session id.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._sessions: dict[str, Session] = {}
        self._by_client: dict[str, str] = {}
        self._ring_after = ""
        self._closed = False
        self._alive_clients: set[str] = set()
        self._frontends = 0
        self.stale_drops = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def robots(self) -> int:
        """Sessions of robots (not of the server's frontends): what ``serving.max_sessions`` bounds."""
        with self._lock:
            return len(self._sessions) - self._frontends

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
            self._frontends += session.frontend - (old is not None and old.frontend)
            self._sessions[session.session_id] = session
            self._by_client[session.client_id] = session.session_id
            return old

    def remove(self, session_id: str) -> Session | None:
        """Drop a session; returns it if it existed."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
            if session is not None:
                self._frontends -= session.frontend
                if self._by_client.get(session.client_id) == session_id:
                    del self._by_client[session.client_id]
            return session

    def client_alive(self, client_id: str) -> bool:
        """Whether the client's liveliness token is there now (it usually arrives before its open)."""
        with self._lock:
            return client_id in self._alive_clients

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
                session.token_lost = session.token_lost or not alive
            return session

    def reset(self, session_id: str, episode_id: int) -> bool:
        """Episode boundary: drop the waiting observation of an older episode, move to ``episode_id``."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return False
            # An observation of the new episode may overtake the reset request; keep it. A held
            # one of the old episode is refused when the worker claims it.
            mailbox = session.mailbox
            if mailbox is not None and mailbox.header.episode_id < episode_id:
                session.mailbox = None
            session.episode_id = max(session.episode_id, episode_id)
            # If an observation of this episode was already served, the worker reset then.
            session.needs_reset = session.needs_reset or episode_id > session.served_episode
            return True

    def deposit(self, session: Session, item: Mail) -> Deposit:
        """Called from the Zenoh callback thread with a decoded observation: newest wins.

        Dropped when ``session`` was closed or replaced since it was authenticated, or when the
        observation belongs to an older episode (a straggler of before a reset).
        """
        with self._lock:
            if self._sessions.get(session.session_id) is not session:
                return "session"
            if item.header.episode_id < session.episode_id:
                self.stale_drops += 1
                return "stale"
            if session.mailbox is not None or session.held:
                session.superseded += 1
            session.mailbox = item
            session.copies.deposited(item.header)
            if not session.held:
                self._ready.notify()
            return "ok"

    def join_copy(self, session: Session, copy: Header) -> Answer | bool:
        """Zenoh's observation thread, a copy of a request (``FLAG_COPY``): see `CopyBook.join`."""
        with self._lock:
            return session.copies.join(copy)

    def answered(self, session: Session, answer: Answer) -> list[Header]:
        """Reply thread, the answer to ``answer.request`` leaves now: the copies it answers too."""
        with self._lock:
            return session.copies.answered(answer)

    def wait_ready(self, timeout: float) -> bool:
        """Worker: block until some mailbox can be taken; False on timeout or close."""
        with self._lock:
            ready = self._ready.wait_for(lambda: self._closed or self._any_ready(), timeout)
            return ready and not self._closed

    def has_ready(self) -> bool:
        """Whether some mailbox can be taken right now."""
        with self._lock:
            return self._any_ready()

    def take(self) -> list[tuple[Session, Mail]]:
        """Worker: empty every mailbox whose session holds nothing yet, in ring order.

        The sessions are marked held until the worker claims (or gives up) what it took.
        """
        with self._lock:
            taken = []
            for session in self._ring_order():
                item = session.mailbox
                if item is None or session.held:
                    continue
                session.mailbox, session.held = None, True
                taken.append((session, item))
            return taken

    def claim(self, session: Session, item: Mail) -> Claim | None:
        """Worker, right before serving ``item`` (taken from ``session``): what to serve now.

        A newer observation that arrived meanwhile is served instead, in this turn. None when
        the session was closed or the episode of what would be served was reset. Otherwise the
        claim carries the item, the superseded count and whether the session must reset first
        (both cleared).
        """
        with self._lock:
            session.held = False
            if self._sessions.get(session.session_id) is not session:
                return None
            if session.mailbox is not None:
                item, session.mailbox = session.mailbox, None
            if item.header.episode_id < session.episode_id:
                self.stale_drops += 1
                session.copies.dropped(item.header)
                return None
            claim = Claim(item, session.superseded, session.needs_reset)
            session.superseded, session.needs_reset = 0, False
            self._ring_after = session.session_id
            return claim

    def close(self) -> None:
        """Stop handing out work; wakes a waiting worker."""
        with self._lock:
            self._closed = True
            self._ready.notify_all()

    def _any_ready(self) -> bool:
        return any(s.mailbox is not None and not s.held for s in self._sessions.values())

    def _ring_order(self) -> Sequence[Session]:
        sessions = list(self._sessions.values())
        ids = list(self._sessions)
        start = ids.index(self._ring_after) + 1 if self._ring_after in self._sessions else 0
        return sessions[start:] + sessions[:start]
