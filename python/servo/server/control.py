"""The control plane: status, session open, reset/close and trajectory queryables.

Handlers run on the event loop (Zenoh's queryable callbacks only hand queries over); each one
returns a message or a `Rejection`, and `answer` turns that into the reply. A bad request, or a
bug in a handler, costs that one query — never the server.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import zenoh

from servo.logs import get_logger
from servo.policy import Policy
from servo.policy.compatibility import Admission, validate_open
from servo.server.sessions import Session
from servo.server.state import ServerState
from servo.server.trajectories import TrajectoryLibrary
from servo.transport import LoopBridge, declare_action_publisher
from servo.wire import (
    SUPPORTED_SCHEMA_VERSIONS,
    CloseRequest,
    ControlAck,
    ControlRequest,
    Rejection,
    ResetRequest,
    SessionAck,
    SessionOpen,
    StatusReply,
    WireError,
    decode,
    encode,
)

log = get_logger(__name__)

Handler = Callable[[zenoh.Query, bytes], msgspec.Struct]


class ControlPlane:
    """Answers one replica's control queries. Owned by the event loop.

    Args:
        state: What the server's parts share (lifecycle, replica, sessions, metrics).
        policy: Makes each session's processor.
        zsession: Declares the queryables and each session's action publisher.
        trajectories: The trajectory library.
    """

    def __init__(
        self,
        state: ServerState,
        *,
        policy: Policy,
        zsession: zenoh.Session,
        trajectories: TrajectoryLibrary,
    ) -> None:
        self._state = state
        self._policy = policy
        self._zsession = zsession
        self._trajectories = trajectories

    def declare(self, bridge: LoopBridge) -> list[zenoh.Queryable[None]]:
        """Declare the queryables; their callbacks only hand the query to the event loop."""
        keys, z = self._state.replica.keys, self._zsession

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
        state = self._state
        replica = state.replica
        keys = replica.keys
        return StatusReply(
            server_id=replica.server_id,
            app=keys.app,
            model_key=keys.model,
            replica=keys.replica,
            schema_versions=list(SUPPORTED_SCHEMA_VERSIONS),
            policy=replica.info,
            warmed_up=state.lifecycle != "starting",
            draining=state.lifecycle == "draining",
            active_sessions=len(state.registry),
            max_sessions=replica.max_sessions,
            load=state.load,
        )

    def _reject(self, code: str, reason: str, **context: object) -> Rejection:
        state = self._state
        state.metrics.sessions_rejected.labels(code).inc()
        log.info("session refused", code=code, reason=reason, **context)
        return Rejection(
            code,  # type: ignore[arg-type]
            reason,
            active_sessions=len(state.registry),
            max_sessions=state.replica.max_sessions,
            load=state.load,
        )

    def open(self, query: zenoh.Query, payload: bytes) -> SessionAck | Rejection:
        """Validate a client against the policy and capacity; bind it to this replica."""
        state = self._state
        replica = state.replica
        keys, info = replica.keys, replica.info
        try:
            request = decode(payload, SessionOpen)
            client_keys = keys.client(request.client_id)
        except WireError as exc:
            return self._reject("bad_request", str(exc))
        if state.lifecycle != "serving":
            return self._reject("draining", "server is draining; open a session on another replica")
        verdict = validate_open(request, info)
        if isinstance(verdict, Rejection):
            return self._reject(verdict.code, verdict.reason, client_id=request.client_id)
        previous = state.registry.by_client(request.client_id)
        active = len(state.registry)
        if previous is None and active >= replica.max_sessions:
            return self._reject(
                "capacity",
                f"server is full ({active}/{replica.max_sessions} sessions)",
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
            server_id=replica.server_id,
            replica=keys.replica,
            policy=info,
            rtc=verdict.rtc,
            task=verdict.task,
            warnings=verdict.warnings,
        )

    def _create_session(self, request: SessionOpen, verdict: Admission, action_key: str) -> Session:
        session = Session(
            session_id=self._state.registry.new_session_id(),
            client_id=request.client_id,
            epoch=request.session_epoch,
            task=verdict.task,
            rtc=verdict.rtc,
            schema_version=verdict.schema_version,
            processor=self._policy.make_processor(),
            publisher=declare_action_publisher(self._zsession, action_key),
        )
        self._state.register(session)
        return session

    def control(self, query: zenoh.Query, payload: bytes) -> ControlAck | Rejection:
        """Reset (episode boundary) or close one of the querying client's sessions."""
        state = self._state
        try:
            client_id = state.replica.keys.client_of(str(query.key_expr))
            request: ControlRequest = decode(payload, ControlRequest)  # type: ignore[arg-type]
        except WireError as exc:
            return self._reject("bad_request", str(exc))
        session = state.registry.get(request.session_id)
        if session is None or session.client_id != client_id:
            return self._reject("unknown_session", f"no session {request.session_id} for client {client_id!r}")
        if isinstance(request, ResetRequest):
            state.registry.reset(session.session_id, request.episode_id)
            log.info(
                "episode reset",
                session_id=session.session_id,
                client_id=client_id,
                episode_id=request.episode_id,
            )
            return ControlAck(session.session_id, request.episode_id)
        assert isinstance(request, CloseRequest)
        state.collect(session, "closed")
        return ControlAck(session.session_id)

    def trajectory(self, query: zenoh.Query, payload: bytes) -> msgspec.Struct:
        """A whole trajectory of the library (or the list of names)."""
        return self._trajectories.answer(payload)
