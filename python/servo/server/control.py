"""The control plane: status, session open, reset/close and trajectory queryables.

Handlers run on the event loop (Zenoh's queryable callbacks only hand queries over); each one
returns a message or a `Rejection`, and `answer` turns that into the reply. A bad request, or a
bug in a handler, costs that one query — never the server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec
import zenoh

from servo.logs import get_logger
from servo.policy import Policy
from servo.policy.compatibility import Admission, validate_open
from servo.server.metrics import ServerMetrics
from servo.server.sessions import Session, SessionRegistry
from servo.server.trajectories import TrajectoryLibrary
from servo.transport import LoopBridge, declare_action_publisher
from servo.wire import (
    SUPPORTED_SCHEMA_VERSIONS,
    CloseRequest,
    ControlAck,
    ControlRequest,
    PolicyInfo,
    Rejection,
    ResetRequest,
    ServerKeys,
    SessionAck,
    SessionOpen,
    StatusReply,
    WireError,
    decode,
    encode,
)

log = get_logger(__name__)

ServerState = Literal["starting", "serving", "draining"]
Handler = Callable[[zenoh.Query, bytes], msgspec.Struct]


class ControlPlane:
    """Answers one replica's control queries. Owned by the event loop.

    Args:
        server_id: Reported in status and acks.
        keys: The replica's keys.
        info: What the replica serves.
        policy: Makes each session's processor.
        zsession: Declares the queryables and each session's action publisher.
        registry: The sessions.
        metrics: Counters to update.
        trajectories: The trajectory library.
        state: The server's lifecycle state.
        max_sessions: Session capacity.
        on_opened: Called with every new session (the server starts its liveliness watch).
        collect: Closes a session with a reason.
    """

    def __init__(
        self,
        *,
        server_id: str,
        keys: ServerKeys,
        info: PolicyInfo,
        policy: Policy,
        zsession: zenoh.Session,
        registry: SessionRegistry,
        metrics: ServerMetrics,
        trajectories: TrajectoryLibrary,
        state: Callable[[], ServerState],
        max_sessions: Callable[[], int],
        on_opened: Callable[[Session], None],
        collect: Callable[[Session, str], None],
    ) -> None:
        self.server_id = server_id
        self._keys = keys
        self._info = info
        self._policy = policy
        self._zsession = zsession
        self.registry = registry
        self.metrics = metrics
        self._trajectories = trajectories
        self._state = state
        self._max_sessions = max_sessions
        self._on_opened = on_opened
        self._collect = collect

    def declare(self, bridge: LoopBridge) -> list[zenoh.Queryable[None]]:
        """Declare the queryables; their callbacks only hand the query to the event loop."""
        keys, z = self._keys, self._zsession

        def on(key: str, handler: Handler, reply_key: str | None) -> zenoh.Queryable[None]:
            return z.declare_queryable(key, lambda q: bridge.call(self.answer, handler, q, reply_key))

        # Replies go out on our own concrete key: a discovery query's selector is a wildcard.
        return [
            on(keys.status, self.status, keys.status),
            on(keys.session, self.open, keys.session),
            on(keys.all_control, self.control, None),
            on(keys.trajectory, self.trajectory, keys.trajectory),
        ]

    def answer(self, handler: Handler, query: zenoh.Query, reply_key: str | None) -> None:
        """Event loop: run a control handler and reply; a bad request never escapes."""
        try:
            payload = b"" if query.payload is None else query.payload.to_bytes()
            result = handler(query, payload)
            if isinstance(result, Rejection):
                query.reply_err(encode(result))
            elif result is not None:
                query.reply(reply_key or query.key_expr, encode(result))
        except zenoh.ZError as exc:
            log.info("control reply failed", key=str(query.key_expr), error=str(exc))
        except Exception as exc:  # a handler bug must cost one request, not the server
            log.exception("control handler failed", key=str(query.key_expr))
            query.reply_err(encode(Rejection("bad_request", f"internal error: {type(exc).__name__}")))
        finally:
            query.drop()

    def status(self, query: zenoh.Query, payload: bytes) -> StatusReply:
        """Capabilities and load of this replica."""
        keys, info = self._keys, self._info
        return StatusReply(
            server_id=self.server_id,
            app=keys.app,
            model_key=keys.model,
            replica=keys.replica,
            schema_versions=list(SUPPORTED_SCHEMA_VERSIONS),
            policy=info,
            warmed_up=self._state() != "starting",
            draining=self._state() == "draining",
            active_sessions=len(self.registry),
            max_sessions=self._max_sessions(),
            load=len(self.registry) / self._max_sessions(),
        )

    def _reject(self, code: str, reason: str, **context: object) -> Rejection:
        self.metrics.sessions_rejected.labels(code).inc()
        log.info("session refused", code=code, reason=reason, **context)
        return Rejection(
            code,  # type: ignore[arg-type]
            reason,
            active_sessions=len(self.registry),
            max_sessions=self._max_sessions(),
            load=len(self.registry) / self._max_sessions(),
        )

    def open(self, query: zenoh.Query, payload: bytes) -> SessionAck | Rejection:
        """Validate a client against the policy and capacity; bind it to this replica."""
        keys, info = self._keys, self._info
        try:
            request = decode(payload, SessionOpen)
            client_keys = keys.client(request.client_id)
        except WireError as exc:
            return self._reject("bad_request", str(exc))
        if self._state() != "serving":
            return self._reject("draining", "server is draining; open a session on another replica")
        verdict = validate_open(request, info)
        if isinstance(verdict, Rejection):
            return self._reject(verdict.code, verdict.reason, client_id=request.client_id)
        previous = self.registry.by_client(request.client_id)
        if previous is None and len(self.registry) >= self._max_sessions():
            return self._reject(
                "capacity",
                f"server is full ({len(self.registry)}/{self._max_sessions()} sessions)",
                client_id=request.client_id,
            )
        session = self._create_session(request, verdict, client_keys.action)
        log.info(
            "session opened",
            session_id=session.session_id,
            client_id=session.client_id,
            epoch=session.epoch,
            rtc=session.rtc,
            task=session.task,
            warnings=verdict.warnings,
            tags=request.tags,
        )
        return SessionAck(
            session_id=session.session_id,
            schema_version=verdict.schema_version,
            server_id=self.server_id,
            replica=keys.replica,
            policy=info,
            rtc=verdict.rtc,
            task=verdict.task,
            warnings=verdict.warnings,
        )

    def _create_session(self, request: SessionOpen, verdict: Admission, action_key: str) -> Session:
        session = Session(
            session_id=self.registry.new_session_id(),
            client_id=request.client_id,
            epoch=request.session_epoch,
            task=verdict.task,
            rtc=verdict.rtc,
            schema_version=verdict.schema_version,
            processor=self._policy.make_processor(),
            publisher=declare_action_publisher(self._zsession, action_key),
        )
        replaced = self.registry.add(session)
        if replaced is not None:
            replaced.close_publisher()
            self.metrics.sessions_collected.labels("replaced").inc()
        self.metrics.sessions_opened.inc()
        self.metrics.active_sessions.set(len(self.registry))
        self._on_opened(session)
        return session

    def control(self, query: zenoh.Query, payload: bytes) -> ControlAck | Rejection:
        """Reset (episode boundary) or close one of the querying client's sessions."""
        keys = self._keys
        try:
            client_id = keys.client_of(str(query.key_expr))
            request: ControlRequest = decode(payload, ControlRequest)  # type: ignore[arg-type]
        except WireError as exc:
            return self._reject("bad_request", str(exc))
        session = self.registry.get(request.session_id)
        if session is None or session.client_id != client_id:
            return self._reject("unknown_session", f"no session {request.session_id} for client {client_id!r}")
        if isinstance(request, ResetRequest):
            self.registry.reset(session.session_id, request.episode_id)
            log.info(
                "episode reset",
                session_id=session.session_id,
                client_id=client_id,
                episode_id=request.episode_id,
            )
            return ControlAck(session.session_id, request.episode_id)
        assert isinstance(request, CloseRequest)
        self._collect(session, "closed")
        return ControlAck(session.session_id)

    def trajectory(self, query: zenoh.Query, payload: bytes) -> msgspec.Struct:
        """A whole trajectory of the library (or the list of names)."""
        return self._trajectories.answer(payload)
