"""The reply stage of the data plane: chunks and errors leave in the order they were served.

One `StageThread` ("servo-reply"): while requests wait for the device, the inference worker hands
over what each forward produced (`Reply`) and goes straight to the next forward; this thread
encodes, encrypts and puts every answer, then accounts for it (metrics, audit). The stage's FIFO
keeps the answers in serving order, and the put of one answer never holds a device that has work
waiting. Answers the stage could not take (its FIFO full behind a stuck put, or closed) are
counted ``undeliverable`` and logged, never lost without a word.

When nothing waits for the device and no earlier answer is still on its way, the worker answers
itself (``here``): handing over would only cost the robot the reply thread's wake-up (0.14 ms a
request on a quiet 2-core machine, more on a busy one), and a put that blocks holds a device that
has nothing to do. The accounting (metrics, the audit line: a file write) still goes to the reply
thread, after the robot has its answer.

Accounting is one place for the served and the refused, so the fleet-wide metrics, the per-robot
metrics (`servo.server.robot_metrics`) and the audit log never disagree. Each answer's staleness
is how old its observation was when it left (arrival to publish, on this server's clock): what a
robot's staleness bound sees of the server.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from servo._core import MSG_CHUNK, MSG_ERROR, Header
from servo.logs import Logger, LogThrottle, get_logger
from servo.policy.protocol import FloatArray
from servo.server.audit import AuditLog
from servo.server.copies import Answer
from servo.server.sessions import Claim, Decoded, Rejected, Session
from servo.server.state import ServerState
from servo.stages import StageThread
from servo.wire import ActionChunk, ErrorEvent, encode, encode_tensor

log = get_logger(__name__)

#: Refused requests and policy failures: one log line per code per second, with the count held back.
_THROTTLE = LogThrottle(1.0)
#: Forwards whose answers may wait for the reply thread (a put stuck on a link holds them).
REPLY_BACKLOG = 256


@dataclass(frozen=True)
class Reply:
    """One served request's answer, as the worker hands it over.

    ``outcome`` is the (model-space, robot-space) chunks, or what made the request fail; for a
    `Rejected` observation it is None (the error is the item's own).
    """

    session: Session
    claim: Claim
    outcome: tuple[FloatArray, FloatArray] | Exception | None
    queue_wait_ms: float
    inference_ms: float
    batch: int


class ReplyStage:
    """Publishes every answer in the order it was submitted: on its stage thread, or ``here``.

    Created and fed (`submit`) by the inference worker, closed by whoever stops the worker (after
    the worker's thread has ended); what is handed to the stage thread is its own after `submit`.
    """

    def __init__(self, state: ServerState, audit: AuditLog) -> None:
        self._state = state
        self._metrics = state.metrics
        self._audit = audit
        self._stage = StageThread("servo-reply", capacity=REPLY_BACKLOG)
        #: Forwards handed to the stage and not yet answered (the worker adds, the stage takes off).
        self._on_their_way = 0
        self._lock = threading.Lock()

    def submit(self, replies: list[Reply], *, here: bool = False) -> None:
        """Answer one forward's requests, together and after every earlier forward's.

        With ``here`` (the caller has nothing else to do) they are published on the calling
        thread, unless earlier answers are still on their way; otherwise the reply thread does.
        """
        with self._lock:
            here = here and self._on_their_way == 0 and not self._stage.closing.is_set()
            if not here:
                self._on_their_way += 1
        if here:
            accounts = self._answer_all(replies)
            self._stage.submit(_account_all, accounts).add_done_callback(_unaccounted)
            return
        self._stage.submit(self._publish_all, replies).add_done_callback(lambda done: self._settled(done, replies))

    def close(self, timeout: float) -> bool:
        """Publish what is queued, then stop; False if that took longer than ``timeout`` s."""
        return self._stage.close(finish=True, timeout=timeout)

    def _publish_all(self, replies: list[Reply]) -> None:
        _account_all(self._answer_all(replies))

    def _answer_all(self, replies: list[Reply]) -> list[Callable[[], None]]:
        """Publish every answer; what is left to account for each, in the same order."""
        accounts = []
        for reply in replies:
            try:
                accounts.append(self._answer_one(reply))
            except Exception:  # a bug here must cost one reply, never the others
                log.exception("publishing a reply failed")
        return accounts

    def _settled(self, done: Future[None], replies: list[Reply]) -> None:
        """Any thread: a forward's answers are settled; those the stage never published are counted and logged."""
        with self._lock:
            self._on_their_way -= 1
        error = done.exception()
        if error is None:
            return
        self._metrics.requests.labels("undeliverable").inc(len(replies))
        if (suppressed := _THROTTLE.allow("undeliverable")) is not None:
            log.warning("answers not published", reason=str(error), count=len(replies), suppressed=suppressed)

    def _answer_one(self, reply: Reply) -> Callable[[], None]:
        """Publish one answer; returns its accounting (run after, on the reply thread)."""
        session, item = reply.session, reply.claim.item
        if isinstance(item, Rejected):
            return self._fail(session, item.header, item.code, item.message, reply)
        if isinstance(reply.outcome, Exception):
            exc = reply.outcome
            account = self._fail(session, item.header, "inference_failed", f"{type(exc).__name__}: {exc}", reply)

            def logged() -> None:
                if (suppressed := _THROTTLE.allow("inference_failed")) is not None:
                    _bound(session, item.header).error(
                        "inference failed", exc_info=exc, batch=reply.batch, suppressed=suppressed
                    )
                account()

            return logged
        assert reply.outcome is not None
        return self._chunk(session, item, reply, *reply.outcome)

    def _chunk(
        self,
        session: Session,
        item: Decoded,
        reply: Reply,
        chunk_model: FloatArray,
        chunk_robot: FloatArray,
    ) -> Callable[[], None]:
        header, claim = item.header, reply.claim
        # Identity post-processing ships one tensor (the edge then uses chunk_robot for both).
        same = chunk_model is chunk_robot or np.array_equal(chunk_model, chunk_robot)
        body = ActionChunk(
            chunk_robot=encode_tensor(chunk_robot),
            chunk_model=None if same else encode_tensor(chunk_model),
            queue_wait_ms=reply.queue_wait_ms,
            inference_ms=reply.inference_ms,
            superseded=claim.superseded,
            server_load=self._state.load,
        )
        # Publish first (the client is waiting), account after; an inference whose session was
        # closed meanwhile is still audited, as undeliverable.
        outcome = "ok" if self._answer(session, MSG_CHUNK, encode(body), header) else "undeliverable"
        return functools.partial(self._account_chunk, session, item, reply, outcome, _staleness_ms(reply))

    def _account_chunk(self, session: Session, item: Decoded, reply: Reply, outcome: str, staleness_ms: float) -> None:
        header, claim = item.header, reply.claim
        self._metrics.requests.labels(outcome).inc()
        self._metrics.superseded.inc(claim.superseded)
        self._metrics.queue_wait_ms.observe(reply.queue_wait_ms)
        self._metrics.inference_ms.observe(reply.inference_ms)
        self._metrics.robots.served(
            session.client_id, outcome, reply.queue_wait_ms, reply.inference_ms, staleness_ms, claim.superseded
        )
        self._audit.write(
            session_id=session.session_id,
            client_id=session.client_id,
            robot_key=session.auth.robot_key,
            enrolled=session.enrolled,
            seq_id=header.seq_id,
            episode_id=header.episode_id,
            queue_wait_ms=reply.queue_wait_ms,
            inference_ms=reply.inference_ms,
            staleness_ms=staleness_ms,
            superseded=claim.superseded,
            inference_delay=item.delay,
            decode_ms=round(item.decode_ns / 1e6, 3),
            outcome=outcome,
            replica=self._state.replica.keys.replica,
        )

    def _fail(self, session: Session, header: Header, code: str, message: str, reply: Reply) -> Callable[[], None]:
        self._answer(session, MSG_ERROR, encode(ErrorEvent(code, message)), header)
        return functools.partial(self._account_failure, session, header, code, message, reply, _staleness_ms(reply))

    def _account_failure(
        self, session: Session, header: Header, code: str, message: str, reply: Reply, staleness_ms: float
    ) -> None:
        self._metrics.requests.labels(code).inc()
        self._metrics.robots.served(session.client_id, code, reply.queue_wait_ms, reply.inference_ms, staleness_ms, 0)
        if code != "inference_failed" and (suppressed := _THROTTLE.allow(code)) is not None:
            _bound(session, header).warning("request refused", code=code, reason=message, suppressed=suppressed)
        self._audit.write(
            session_id=session.session_id,
            client_id=session.client_id,
            robot_key=session.auth.robot_key,
            enrolled=session.enrolled,
            seq_id=header.seq_id,
            episode_id=header.episode_id,
            queue_wait_ms=reply.queue_wait_ms,
            inference_ms=reply.inference_ms,
            staleness_ms=staleness_ms,
            outcome=code,
            replica=self._state.replica.keys.replica,
        )

    def _answer(self, session: Session, msg_type: int, body: bytes, request: Header) -> bool:
        """Publish the answer to ``request``, and to every copy of it that joined meanwhile."""
        copies = self._state.registry.answered(session, Answer(request, msg_type, body))
        if not session.publish(msg_type, body, request):
            # The session was closed by the loop while this request was in flight (or a newer
            # request of it was answered already: see `Session.publish`).
            _bound(session, request).info("reply not sent: session closed")
            return False
        for copy in copies:
            session.publish(msg_type, body, copy)
        return True


def _staleness_ms(reply: Reply) -> float:
    """How old the answered observation is as its answer leaves (arrival to publish)."""
    return (time.monotonic_ns() - reply.claim.item.received_ns) / 1e6


def _account_all(accounts: list[Callable[[], None]]) -> None:
    for account in accounts:
        try:
            account()
        except Exception:  # a bug here must cost one line of accounting, never the others
            log.exception("accounting for a reply failed")


def _unaccounted(done: Future[None]) -> None:
    """Any thread: answers that left but the reply thread could not take their accounting (full, closed)."""
    if (error := done.exception()) is not None and (suppressed := _THROTTLE.allow("unaccounted")) is not None:
        log.warning("answers sent without metrics or audit lines", reason=str(error), suppressed=suppressed)


def _bound(session: Session, header: Header) -> Logger:
    """A logger naming the request answered (made only to log: binding costs more than a put)."""
    return log.bind(
        session_id=session.session_id, client_id=session.client_id, seq_id=header.seq_id, episode_id=header.episode_id
    )


def queue_wait_ms(item: Decoded | Rejected, start_ns: int) -> float:
    """How long ``item`` waited for the device: from ready (authenticated, decoded) to ``start_ns``."""
    ready_ns = item.ready_ns if isinstance(item, Decoded) else item.received_ns
    return max(0.0, (start_ns - ready_ns) / 1e6)
