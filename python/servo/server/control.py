"""The control plane: status, session open (the handshake), reset/close, trajectory and audit queryables.

Handlers run on the event loop (callbacks, on zenoh-python's threads, never Zenoh's: `servo.server.lanes`,
only hand queries over); each returns a message, a `Sealed` message or a `Rejection`, and `answer`
turns that into the reply. A bad request, or a bug in a handler, costs that one query, never the server.

Who may do what (see `servo.server.auth` for the checks themselves):

* a session is opened on the client's own ``…/c/<client>/session`` key, whose client id the
  request must repeat, signed by the robot's identity (`servo.server.robots` decides who may
  open, and how often, before validation and capacity); a client that already has a live
  session here gets ``session_exists`` unless the open is signed by the same robot, proves it
  holds that session's key, or the old client is gone;
* reset and close must be encrypted with the session key (a fresh seq_id each); anything else is
  refused, counted in ``servo_control_rejected_total{reason}``, and changes nothing;
* the replies to reset and close are encrypted too, so the client can tell them from a forgery;
* the status, the trajectories and the audit trail are signed doors, bounded before they read a
  query (`servo.server.signed_door`): trajectories are fetched by the robots the admission rule
  lets in (`servo.server.trajectories`), the audit trail is read by operators (the fleet) and
  robots (their own rows) only (`servo.server.audit_door`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import zenoh
from zenoh.handlers import Callback

from servo._core import MSG_CONTROL_ACK, Header, SessionKey
from servo.access import Caller
from servo.logs import LogThrottle, get_logger
from servo.policy.compatibility import Admission, validate_open
from servo.policy.runner import Forwards
from servo.server.admission import ImageGate, TokenBucket, camera_shapes, input_sizes
from servo.server.audit_door import AuditDoor
from servo.server.auth import Refused, SessionAuth, accept_handshake, takeover, verify_control
from servo.server.manifest import LimitsSection
from servo.server.robots import Refusal, RobotGate
from servo.server.sessions import Session
from servo.server.signed_door import MAX_STATUS_NONCE, DoorBudget, Signed, StatusDoor
from servo.server.state import ServerState
from servo.server.trajectories import TrajectoryDoor, TrajectoryLibrary
from servo.stages import LoopBridge
from servo.transport import declare_action_publisher
from servo.wire import (
    SUPPORTED_SCHEMA_VERSIONS,
    CameraFeature,
    CloseRequest,
    ControlAck,
    ControlRequest,
    Rejection,
    ResetRequest,
    SessionAck,
    SessionOpen,
    WireError,
    decode,
    encode,
    reply_header,
)
from servo.wire.messages import RejectCode, SchemaVersions

log = get_logger(__name__)

#: Largest control-plane request body (a session open with every field at its bound fits easily).
MAX_CONTROL_BYTES = 64 * 1024
_THROTTLE = LogThrottle(1.0)


@dataclass(frozen=True)
class Sealed:
    """A reply encrypted with a session key (control acks); made and sent on the event loop."""

    message: msgspec.Struct
    key: SessionKey
    header: Header


Handler = Callable[[zenoh.Query, zenoh.ZBytes], msgspec.Struct | Sealed | Signed | None]


def body(payload: zenoh.ZBytes) -> bytes:
    """A control request's body, copied out of Zenoh only once it is known to fit `MAX_CONTROL_BYTES`.

    Raises:
        WireError: The body is larger (nobody makes the event loop copy Zenoh's largest message).
    """
    if len(payload) > MAX_CONTROL_BYTES:
        raise WireError(f"control request of {len(payload)} bytes exceeds the limit of {MAX_CONTROL_BYTES}")
    return payload.to_bytes()


class _Versions(msgspec.Struct):
    """What any version of a session open carries, to refuse it by version (bounded: echoed in the refusal)."""

    schema_versions: SchemaVersions = []


class ControlPlane:
    """Answers one replica's control queries. Owned by the event loop.

    Args:
        state: What the server's parts share (lifecycle, replica, sessions, metrics).
        policy: Makes each session's processor.
        zsession: Declares the queryables and each session's action publisher.
        trajectories: The trajectory library.
        robots: Who may open sessions, how often (`servo.server.robots`).
        takeover_idle_s: See `servo.server.auth.takeover`.
        limits: Rates and sizes a peer may ask for (`servo.server.admission`).
        max_observation_bytes: The observation size bound (each session's image gate decodes
            within it).
    """

    def __init__(
        self,
        state: ServerState,
        *,
        policy: Forwards,
        zsession: zenoh.Session,
        trajectories: TrajectoryLibrary,
        robots: RobotGate,
        takeover_idle_s: float,
        limits: LimitsSection,
        max_observation_bytes: int,
    ) -> None:
        self._state = state
        self._policy = policy
        self._zsession = zsession
        self._robots = robots
        self._takeover_idle_s = takeover_idle_s
        self._limits = limits
        self._max_observation_bytes = max_observation_bytes
        replica, metrics = state.replica, state.metrics
        at = {"prefix": replica.keys.prefix, "replica": replica.keys.replica}
        self._status = StatusDoor(state.status, robots.nonces.current, replica.identity, metrics, limits)
        self._audit = AuditDoor(state.recent, robots.nonces, robots.access, replica.identity, metrics, limits, **at)
        self._trajectories = TrajectoryDoor(trajectories, robots.access, replica.identity, metrics, limits, **at)
        self._opens = DoorBudget("session", metrics, rate=limits.door_requests_per_s, burst=limits.door_request_burst)

    def declare(self, bridge: LoopBridge) -> list[zenoh.Queryable[None]]:
        """Declare the queryables; their callbacks only hand the query to the event loop (`LoopBridge.call`).

        A signed door's callback (and the session opens') first asks its budget (`DoorBudget.knock`):
        beyond it the query is dropped on the callback thread, unread and unanswered.
        """
        keys, z = self._state.replica.keys, self._zsession

        def on(
            key: str, handler: Handler, reply_key: str | None, budget: DoorBudget | None = None
        ) -> zenoh.Queryable[None]:
            def ask(q: zenoh.Query) -> None:
                if budget is None or budget.knock():
                    bridge.call(self.answer, handler, q, reply_key)
                else:
                    q.drop()

            return z.declare_queryable(key, Callback(ask))

        # Replies go out on our own concrete key: a discovery query's selector is a wildcard.
        return [
            on(keys.status, self.status, keys.status, self._status.budget),
            on(keys.all_sessions, self.open, None, self._opens),
            on(f"{keys.prefix}/session", self.open_legacy, None, self._opens),
            on(keys.all_control, self.control, None),
            on(keys.trajectory, self.trajectory, keys.trajectory, self._trajectories.budget),
            on(keys.audit, self.audit, keys.audit, self._audit.budget),
        ]

    def answer(self, handler: Handler, query: zenoh.Query, reply_key: str | None) -> None:
        """Event loop: run a control handler and reply; a bad request never escapes.

        The handler gets the payload still in Zenoh: it copies it (`body`) only within its bound.
        """
        try:
            result = handler(query, zenoh.ZBytes(b"") if query.payload is None else query.payload)
            key = reply_key or query.key_expr
            if isinstance(result, Rejection):
                query.reply_err(encode(result))
            elif isinstance(result, Sealed):
                attachment, ciphertext = result.key.encrypt(result.header, encode(result.message))
                query.reply(key, ciphertext, attachment=attachment)
            elif isinstance(result, Signed):
                query.reply(key, result.body, attachment=result.attachment)
            elif result is not None:
                query.reply(key, encode(result))
        except zenoh.ZError as exc:
            log.info("control reply failed", key=str(query.key_expr), error=str(exc))
        except Exception as exc:  # a handler bug must cost one request, not the server
            log.exception("control handler failed", key=str(query.key_expr))
            query.reply_err(encode(Rejection("bad_request", f"internal error: {type(exc).__name__}")))
        finally:
            query.drop()

    def status(self, query: zenoh.Query, payload: zenoh.ZBytes) -> Signed | Rejection:
        """Capabilities, load and identity of this replica, signed over the asker's nonce (the payload, if any)."""
        if len(payload) > MAX_STATUS_NONCE:
            return Rejection("bad_request", f"a status query carries at most a {MAX_STATUS_NONCE}-byte nonce")
        return self._status.answer(payload.to_bytes())

    def _reject(self, code: RejectCode, reason: str, **context: object) -> Rejection:
        state = self._state
        state.metrics.sessions_rejected.labels(code).inc()
        if (suppressed := _THROTTLE.allow(("open", code))) is not None:
            log.info("session refused", code=code, reason=reason, suppressed=suppressed, **context)
        return Rejection(
            code,
            reason,
            active_sessions=state.registry.robots(),
            max_sessions=state.replica.max_sessions,
            load=state.load,
        )

    def open_legacy(self, query: zenoh.Query, payload: zenoh.ZBytes) -> Rejection:
        """Schema 1 clients open on ``<p>/session``: tell them which versions this server speaks."""
        try:
            versions = sorted(decode(body(payload), _Versions).schema_versions)
        except WireError:
            versions = []
        return self._reject(
            "schema_version",
            f"client speaks {versions}, server speaks {list(SUPPORTED_SCHEMA_VERSIONS)} "
            "(schema 2 and later open sessions on <prefix>/c/<client_id>/session)",
        )

    def open(self, query: zenoh.Query, payload: zenoh.ZBytes) -> SessionAck | Rejection:
        """The handshake: validate a client against the policy and capacity, bind it, sign the ack."""
        state = self._state
        replica = state.replica
        keys, info = replica.keys, replica.info
        try:
            client_id = keys.client_of(str(query.key_expr))
            request_body = body(payload)
            versions = decode(request_body, _Versions).schema_versions
            if not set(versions) & set(SUPPORTED_SCHEMA_VERSIONS):
                return self._reject(
                    "schema_version",
                    f"client speaks {sorted(versions)}, server speaks {list(SUPPORTED_SCHEMA_VERSIONS)}",
                )
            request = decode(request_body, SessionOpen)
        except WireError as exc:
            return self._reject("bad_request", str(exc))
        if request.client_id != client_id:
            return self._reject(
                "bad_request",
                f"client_id {request.client_id!r} does not match the key's {client_id!r} "
                "(open a session on your own …/c/<client_id>/session key)",
            )
        if state.lifecycle != "serving":
            return self._reject("draining", "server is draining; open a session on another replica")
        caller = self._robots.admit(request, keys.prefix)
        if isinstance(caller, Refusal):
            return self._reject(caller.code, caller.reason, client_id=client_id)
        verdict = validate_open(request, info)
        if isinstance(verdict, Rejection):
            return self._reject(verdict.code, verdict.reason, client_id=client_id)
        shapes = camera_shapes(request.features, info.features, self._limits)
        if isinstance(shapes, Rejection):
            return self._reject(shapes.code, shapes.reason, client_id=client_id)
        previous = state.registry.by_client(client_id)
        frontend = caller.kind == "server"  # the replica's own frontends (the openpi door) open with its key
        if previous is not None:
            why = takeover(
                previous.auth,
                request,
                client_present=state.registry.holder_present(previous),
                idle_s=self._takeover_idle_s,
            )
            if why is None:
                return self._reject(
                    "session_exists",
                    f"client {client_id!r} already has a live session on this replica, opened by another "
                    "robot identity; close it first (or prove you hold it: SessionOpen.resume)",
                    client_id=client_id,
                )
            log.info("session takeover", session_id=previous.session_id, client_id=client_id, why=why)
        elif not frontend and state.registry.robots() >= replica.max_sessions:
            # The frontends' sessions count against their own doors' capacity, never the robots'.
            idle = self._robots.displaceable(request.robot_key, state.registry.snapshot())
            if idle is None:
                active = state.registry.robots()
                return self._reject(
                    "capacity", f"server is full ({active}/{replica.max_sessions} sessions)", client_id=client_id
                )
            log.info("session displaced", session_id=idle.session_id, client_id=idle.client_id, by=client_id)
            state.collect(idle, "displaced")
        # The operators every ack names: robots encrypt their telemetry to them.
        readers = list(self._robots.access.rules.operators.values())
        try:
            handshake = accept_handshake(request, replica.identity, keys.replica, readers)
        except Refused as exc:
            return self._reject("bad_request", str(exc), client_id=client_id)
        smaller = input_sizes(shapes, info.features)
        gate = ImageGate(shapes, max_bytes=self._max_observation_bytes, smaller=smaller)
        session = self._create_session(request, caller, verdict, handshake.auth, gate)
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
            session_id=handshake.auth.wire_id,
            schema_version=verdict.schema_version,
            server_id=replica.server_id,
            replica=keys.replica,
            policy=info,
            rtc=verdict.rtc,
            task=verdict.task,
            server_key=handshake.server_key,
            server_identity=replica.identity.public_key,
            signature=handshake.signature,
            warnings=verdict.warnings,
            input_sizes={name: CameraFeature(h, w) for name, (h, w) in smaller.items()},
            operators=readers,
        )

    def _create_session(
        self, request: SessionOpen, caller: Caller, verdict: Admission, auth: SessionAuth, images: ImageGate
    ) -> Session:
        action_key = self._state.replica.keys.client(request.client_id).action
        session = Session(
            auth=auth,
            client_id=request.client_id,
            task=verdict.task,
            rtc=verdict.rtc,
            schema_version=verdict.schema_version,
            processor=self._policy.make_processor(),
            publisher=declare_action_publisher(self._zsession, action_key),
            images=images,
            observations=TokenBucket(self._limits.observations_per_s, self._limits.observation_burst),
            # A frontend's clients (openpi) are its door's, not robots this replica enrolled.
            enrolled=caller.kind == "robot" and caller.enrolled,
            frontend=caller.kind == "server",
        )
        self._state.register(session)
        return session

    def control(self, query: zenoh.Query, payload: zenoh.ZBytes) -> Sealed | Rejection:
        """Reset (episode boundary) or close the querying client's session, if the request is encrypted by it."""
        state = self._state
        try:
            client_id = state.replica.keys.client_of(str(query.key_expr))
        except WireError as exc:
            return self._refuse_control("header", "bad_request", str(exc))
        session = state.registry.by_client(client_id)
        try:
            header, request_body = verify_control(
                None if session is None else session.auth, query.attachment, payload, max_bytes=MAX_CONTROL_BYTES
            )
        except Refused as exc:
            codes: dict[str, RejectCode] = {"session": "unknown_session", "too_large": "bad_request"}
            code = codes.get(exc.reason, "unauthenticated")
            return self._refuse_control(exc.reason, code, f"{exc} (client {client_id!r})")
        assert session is not None
        try:
            request: ControlRequest = decode(request_body, ControlRequest)
        except WireError as exc:
            return self._refuse_control("body", "bad_request", str(exc))
        if request.session_id != session.auth.wire_id:
            return self._refuse_control("body", "bad_request", "the body names another session than the header")
        ack = reply_header(header, MSG_CONTROL_ACK)
        if isinstance(request, ResetRequest):
            state.registry.reset(session.session_id, request.episode_id)
            log.info(
                "episode reset",
                session_id=session.session_id,
                client_id=client_id,
                episode_id=request.episode_id,
            )
            return Sealed(ControlAck(session.auth.wire_id, request.episode_id), session.auth.key, ack)
        assert isinstance(request, CloseRequest)
        state.collect(session, "closed")
        return Sealed(ControlAck(session.auth.wire_id), session.auth.key, ack)

    def _refuse_control(self, reason: str, code: RejectCode, message: str) -> Rejection:
        self._state.metrics.control_rejected.labels(reason).inc()
        if (suppressed := _THROTTLE.allow(("control", reason))) is not None:
            log.warning("control request refused", reason=reason, detail=message, suppressed=suppressed)
        return Rejection(code, message)

    def audit(self, query: zenoh.Query, payload: zenoh.ZBytes) -> Signed | Rejection | None:
        """The replica's recent requests, for who may read them (`servo.server.audit_door`)."""
        return self._signed(self._audit, payload)

    def trajectory(self, query: zenoh.Query, payload: zenoh.ZBytes) -> Signed | Rejection | None:
        """A whole trajectory of the library (or the list of names), for who may fetch one (`TrajectoryDoor`)."""
        return self._signed(self._trajectories, payload)

    @staticmethod
    def _signed(door: AuditDoor | TrajectoryDoor, payload: zenoh.ZBytes) -> Signed | Rejection | None:
        try:
            return door.answer(body(payload))
        except WireError as exc:
            return Rejection("bad_request", str(exc))
