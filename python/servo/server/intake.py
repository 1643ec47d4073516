"""The receive stage of the data plane: from a Zenoh sample to a decoded observation in a mailbox.

One stage, one thread: Zenoh runs the observation subscriber's callback on its own thread, and
everything an observation needs before the device happens there, in this order: route by key,
authenticate (`servo.server.auth`), admit (rate, frame sizes: `servo.server.admission`), decode
(`servo.server.decoding`), deposit (`servo.server.sessions`). A copy of a request the server holds
or answered is answered from that (`servo.server.copies`) and never decoded. The inference worker then finds it
ready: no decode and no thread hop stand between the mailbox and the forward.
"""

from __future__ import annotations

import time

import zenoh

from servo._core import FLAG_COPY, MSG_ERROR, Header
from servo.logs import LogThrottle, get_logger
from servo.server.auth import Reason, Refused, verify_observation
from servo.server.decoding import ObservationDecoder
from servo.server.manifest import Manifest
from servo.server.notices import KeylessNotices
from servo.server.sessions import Session
from servo.server.state import ServerState
from servo.wire import ErrorEvent, WireError, encode

log = get_logger(__name__)


class ObservationIntake:
    """Authenticates, admits, decodes and deposits every observation sample.

    `on_sample` runs on the intake threads (`servo.server.lanes`: a session's observations always
    on the same one); built on the event loop before the subscriber is declared. Its throttles,
    the registry and the decoder are thread-safe.

    Args:
        state: The server's shared state (registry, metrics, replica keys).
        manifest: Bounds on observations (size, rate).
        decoder: Turns an authenticated message into what a processor takes.
        notices: Sends the signed ``unknown_session`` notice (`servo.server.notices`).
    """

    def __init__(
        self, state: ServerState, manifest: Manifest, decoder: ObservationDecoder, notices: KeylessNotices
    ) -> None:
        self._state = state
        self._registry = state.registry
        self._metrics = state.metrics
        self._max_bytes = manifest.serving.max_observation_bytes
        self._rate = manifest.limits.observations_per_s
        self._decode = decoder
        self._notices = notices
        # Rejected observations: one log line per reason per second.
        self._log_throttle = LogThrottle(1.0)

    def on_sample(self, sample: zenoh.Sample) -> None:
        """Route by key, authenticate, admit, decode, deposit, return.

        Nothing unauthenticated reaches a mailbox: a forged, replayed or foreign observation is
        dropped and counted in ``servo_observations_rejected_total{reason}``, never answered with
        a chunk. An authenticated one beyond the session's rate is dropped too (``rate``); one
        whose frames are not the sizes the session declared is answered with an error before any
        pixel is decoded (``image``, `servo.server.admission`). Only a well-formed observation
        naming a session this replica does not know gets the signed ``unknown_session`` notice
        (`servo.server.notices`), so a client whose server restarted re-opens at once.
        """
        now = time.monotonic_ns()
        try:
            client_id = self._state.replica.keys.client_of(str(sample.key_expr))
        except WireError as exc:
            self._reject(Refused("key", str(exc)), None)
            return
        session = self._registry.by_client(client_id)
        try:
            header, body = verify_observation(
                None if session is None else session.auth,
                sample.attachment,
                sample.payload,
                max_bytes=self._max_bytes,
            )
        except Refused as exc:
            self._reject(exc, client_id)
            if exc.reason == "session" and exc.header is not None:
                self._notices.unknown_session(client_id, exc.header)
            return
        assert session is not None
        if not session.streamed:  # its robot key now counts as returning (servo.server.robots)
            session.streamed = True
            self._state.returning.add(session.auth.robot_key)
        # Answered, never queued: a one-in-flight client learns at once instead of timing out.
        if not session.observations.take():
            self._refuse(session, header, "rate", "rate_limited", f"more than {self._rate:g} observations/s")
            return
        if header.flags & FLAG_COPY and self._answer_copy(session, header):
            return
        try:
            session.images.check(body)
        except WireError as exc:
            self._refuse(session, header, "image", "bad_observation", str(exc))
            return
        outcome = self._registry.deposit(session, self._decode(header, body, now, session))
        if outcome != "ok":
            self._metrics.observations_rejected.labels(outcome).inc()
            self._metrics.robots.rejected(client_id, outcome)

    def _answer_copy(self, session: Session, copy: Header) -> bool:
        """Whether ``copy`` is answered from its original (joined, or its answer sent again)."""
        outcome = self._registry.join_copy(session, copy)
        if outcome is False:
            self._metrics.copies.labels("served").inc()
            return False
        if outcome is True:
            self._metrics.copies.labels("joined").inc()
        else:
            self._metrics.copies.labels("answered").inc()
            session.publish(outcome.msg_type, outcome.body, copy)
        return True

    def _refuse(self, session: Session, header: Header, reason: Reason, code: str, message: str) -> None:
        self._reject(Refused(reason, message, header), session.client_id)
        self._metrics.requests.labels(code).inc()
        session.publish(MSG_ERROR, encode(ErrorEvent(code, message)), header)

    def _reject(self, refused: Refused, client_id: str | None) -> None:
        self._metrics.observations_rejected.labels(refused.reason).inc()
        self._metrics.robots.rejected(client_id, refused.reason)
        if (suppressed := self._log_throttle.allow(refused.reason)) is not None:
            log.warning(
                "observation rejected",
                reason=refused.reason,
                detail=str(refused),
                client_id=client_id,
                suppressed=suppressed,
            )
