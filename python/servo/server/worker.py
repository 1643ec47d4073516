"""The inference worker: the one thread that owns the policy and the device."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import structlog
import zenoh

from servo._core import MSG_CHUNK, MSG_ERROR, Header, encode_header
from servo.policy import DecodedObservation
from servo.policy.runner import InferenceRunner
from servo.server.audit import AuditLog
from servo.server.metrics import ServerMetrics
from servo.server.scheduler import Scheduler
from servo.server.sessions import Pending, Rejected, Session, SessionRegistry, Work
from servo.wire import (
    ActionChunk,
    ErrorEvent,
    Observation,
    WireError,
    decode,
    decode_image,
    decode_tensor,
    encode,
    encode_tensor,
)

log = structlog.get_logger(__name__)


class InferenceWorker:
    """Serves pending observations one at a time, in the order the scheduler picks.

    Owns the `InferenceRunner` (policy, device) and every session's processor; runs on its own
    thread so the event loop never waits on a forward pass.
    """

    def __init__(
        self,
        runner: InferenceRunner,
        registry: SessionRegistry,
        scheduler: Scheduler,
        metrics: ServerMetrics,
        audit: AuditLog,
        *,
        exclusive: bool,
        pin_task: bool,
        max_observation_bytes: int,
        load: Callable[[], float],
    ) -> None:
        self._runner = runner
        self._registry = registry
        self._scheduler = scheduler
        self._metrics = metrics
        self._audit = audit
        self._exclusive = exclusive
        self._pin_task = pin_task
        self._max_bytes = max_observation_bytes
        self._load = load
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="servo-inference", daemon=True)
        spec = runner.policy.spec
        self._state_dim = len(spec.features.state_names)
        self._action_dim = len(spec.features.action_names)
        self._cameras = tuple(spec.features.cameras)
        self._chunk_size = spec.chunk_size

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Finish the request in flight, then stop. Returns False if it did not stop in time."""
        self._stop.set()
        self._registry.close()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            for session in self._scheduler.select(self._registry.wait_work(timeout=0.25)):
                work = self._registry.take(session)
                if work is not None:
                    self._serve(work)

    def _serve(self, work: Work) -> None:
        session, item = work.session, work.item
        start_ns = time.monotonic_ns()
        queue_wait_ms = (start_ns - item.received_ns) / 1e6
        bound = log.bind(session_id=session.session_id, client_id=session.client_id)
        if work.reset:
            session.processor.reset()
            if self._exclusive:
                self._runner.policy.reset()
        if isinstance(item, Rejected):
            self._fail(session, item.header, item.code, item.message, queue_wait_ms, 0.0, bound)
            return
        header = item.header
        bound = bound.bind(seq_id=header.seq_id, episode_id=header.episode_id)
        try:
            obs, delay = self._decode(item, session)
        except WireError as exc:
            self._fail(session, header, "bad_observation", str(exc), queue_wait_ms, 0.0, bound)
            return
        infer_start = time.monotonic_ns()
        try:
            chunk_model, chunk_robot = self._runner.infer(session.processor, obs, delay)
        except Exception as exc:  # a policy bug must cost one request, not the server
            inference_ms = (time.monotonic_ns() - infer_start) / 1e6
            bound.exception("inference failed")
            self._fail(
                session,
                header,
                "inference_failed",
                f"{type(exc).__name__}: {exc}",
                queue_wait_ms,
                inference_ms,
                bound,
            )
            return
        inference_ms = (time.monotonic_ns() - infer_start) / 1e6
        body = ActionChunk(
            chunk_model=encode_tensor(chunk_model),
            chunk_robot=encode_tensor(chunk_robot),
            queue_wait_ms=queue_wait_ms,
            inference_ms=inference_ms,
            superseded=work.superseded,
            server_load=self._load(),
        )
        reply = Header(
            schema_version=session.schema_version,
            msg_type=MSG_CHUNK,
            flags=0,
            seq_id=header.seq_id,
            episode_id=header.episode_id,
            session_epoch=header.session_epoch,
            client_mono_ns=header.client_mono_ns,
        )
        if not _publish(session, encode(body), reply, bound):
            return
        session.served += 1
        self._metrics.requests.labels("ok").inc()
        self._metrics.superseded.inc(work.superseded)
        self._metrics.queue_wait_ms.observe(queue_wait_ms)
        self._metrics.inference_ms.observe(inference_ms)
        self._audit.write(
            session_id=session.session_id,
            client_id=session.client_id,
            seq_id=header.seq_id,
            episode_id=header.episode_id,
            queue_wait_ms=round(queue_wait_ms, 3),
            inference_ms=round(inference_ms, 3),
            superseded=work.superseded,
            inference_delay=delay,
            outcome="ok",
        )

    def _decode(self, item: Pending, session: Session) -> tuple[DecodedObservation, int]:
        msg = decode(item.payload, Observation, max_bytes=self._max_bytes)
        state = decode_tensor(
            msg.state, dtype="float32", shape=(self._state_dim,), what="observation.state"
        )
        images = {}
        for name in self._cameras:
            if name not in msg.images:
                raise WireError(f"observation has no image for camera {name!r}")
            images[name] = decode_image(msg.images[name], what=f"observation.images[{name!r}]")
        prefix_model = prefix_robot = None
        if session.rtc:
            shape = (None, self._action_dim)
            if msg.prefix_model is not None:
                prefix_model = decode_tensor(
                    msg.prefix_model, dtype="float32", shape=shape, what="observation.prefix_model"
                )
            if msg.prefix_robot is not None:
                prefix_robot = decode_tensor(
                    msg.prefix_robot, dtype="float32", shape=shape, what="observation.prefix_robot"
                )
        if not np.isfinite(state).all():
            raise WireError("observation.state contains NaN or inf")
        delay = max(0, min(msg.inference_delay_steps, self._chunk_size))
        obs = DecodedObservation(
            state=state,  # type: ignore[arg-type]
            images=images,
            task=session.task if self._pin_task or not msg.task else msg.task,
            prefix_model=prefix_model,  # type: ignore[arg-type]
            prefix_robot=prefix_robot,  # type: ignore[arg-type]
        )
        return obs, delay

    def _fail(
        self,
        session: Session,
        header: Header | None,
        code: str,
        message: str,
        queue_wait_ms: float,
        inference_ms: float,
        bound: structlog.typing.FilteringBoundLogger,
    ) -> None:
        reply = Header(
            schema_version=session.schema_version,
            msg_type=MSG_ERROR,
            flags=0,
            seq_id=0 if header is None else header.seq_id,
            episode_id=session.episode_id if header is None else header.episode_id,
            session_epoch=session.epoch,
            client_mono_ns=0 if header is None else header.client_mono_ns,
        )
        _publish(session, encode(ErrorEvent(code, message)), reply, bound)
        session.errors += 1
        self._metrics.requests.labels(code).inc()
        bound.warning("request refused", code=code, reason=message)
        self._audit.write(
            session_id=session.session_id,
            client_id=session.client_id,
            seq_id=None if header is None else header.seq_id,
            episode_id=None if header is None else header.episode_id,
            queue_wait_ms=round(queue_wait_ms, 3),
            inference_ms=round(inference_ms, 3),
            outcome=code,
        )


def _publish(
    session: Session, body: bytes, header: Header, bound: structlog.typing.FilteringBoundLogger
) -> bool:
    try:
        session.publisher.put(body, attachment=encode_header(header))
    except zenoh.ZError as exc:
        # The session was closed by the loop while this request was in flight.
        bound.info("reply not sent: session closed", error=str(exc))
        return False
    return True
