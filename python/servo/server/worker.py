"""The inference worker: the one thread that owns the policy and the device.

The worker's loop is the server's throughput: every microsecond it spends on something other
than a forward pass is device time lost for every client. So, per request:

* decoding happens before, on the decoder thread (`servo.server.decoding`) while the worker runs
  another session's forward; an idle worker decodes for itself (one thread hop less);
* the reply (encode, put, metrics, audit) is handed to the reply thread when another observation
  is already waiting, so the next forward starts at once; an idle worker publishes inline.

Measured with ``benches/bench_server.py`` (20 ms forwards, two 480x640 cameras): 97-98 % of the
ideal rate at 2-16 clients, against 94-95 % (raw) and 73-79 % (JPEG q90) when the worker decoded
and published itself.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from servo._core import MSG_CHUNK, MSG_ERROR, Header
from servo.logs import Logger, get_logger
from servo.policy.protocol import FloatArray
from servo.policy.runner import InferenceRunner
from servo.server.audit import AuditLog
from servo.server.decoding import DecoderThread, ObservationDecoder
from servo.server.scheduler import Scheduler
from servo.server.sessions import Decoded, Rejected, Session, Work
from servo.server.state import ServerState
from servo.wire import ActionChunk, ErrorEvent, encode, encode_tensor

log = get_logger(__name__)

#: How often a stopping worker's join looks at the abandon flag.
_JOIN_SLICE_S = 0.05


class InferenceWorker:
    """Serves decoded observations one at a time, in the order the scheduler picks.

    Owns the `InferenceRunner` (policy, device) and every session's processor; runs on its own
    thread so the event loop never waits on a forward pass. A `DecoderThread` it starts and stops
    decodes observations ahead of it.
    """

    def __init__(
        self,
        runner: InferenceRunner,
        state: ServerState,
        scheduler: Scheduler,
        audit: AuditLog,
        *,
        max_observation_bytes: int,
    ) -> None:
        self._runner = runner
        self._state = state
        self._registry = state.registry
        self._scheduler = scheduler
        self._metrics = state.metrics
        self._audit = audit
        self._exclusive = state.replica.exclusive
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="servo-inference", daemon=True)
        self._decode = ObservationDecoder(
            runner.policy.spec, max_observation_bytes=max_observation_bytes, pin_task=state.replica.info.pin_task
        )
        self._decoder = DecoderThread(state.registry, self._decode)
        self._replies = ReplyThread()

    def start(self) -> None:
        """Start the decoder, reply and worker threads."""
        self._decoder.start()
        self._replies.start()
        self._thread.start()

    def stop(self, timeout: float, *, abandon: threading.Event | None = None) -> bool:
        """Finish the request in flight and publish its reply, then stop.

        Returns False if the request did not finish within ``timeout`` s, or ``abandon`` was set
        first (the forward then runs on in its daemon thread, unanswered).
        """
        self._stop.set()
        self._registry.close()
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and time.monotonic() < deadline and not (abandon and abandon.is_set()):
            self._thread.join(_JOIN_SLICE_S)
        finished = not self._thread.is_alive()
        self._replies.stop(timeout)
        self._decoder.stop(timeout)
        return finished

    def _run(self) -> None:
        while not self._stop.is_set():
            ready = self._registry.wait_work(timeout=0.25)
            if not ready:
                # Idle with a raw observation: decode it here rather than wait for a hand-off.
                taken = self._registry.take_raw()
                if taken is not None:
                    session, item = taken
                    self._registry.finish_decode(session, item, self._decode(item, session))
                continue
            for session in self._scheduler.select(ready):
                work = self._registry.take(session)
                if work is None:
                    continue
                try:
                    self._serve(work)
                except Exception:  # a bug here must cost one request, never the worker thread
                    log.exception("request handling failed", session_id=session.session_id)

    def _serve(self, work: Work) -> None:
        session, item = work.session, work.item
        start_ns = time.monotonic_ns()
        decode_ns = 0 if isinstance(item, Rejected) else item.decode_ns
        # Time spent waiting, not decoding: decoding is neither queue wait nor inference.
        queue_wait_ms = (start_ns - item.received_ns - decode_ns) / 1e6
        bound = log.bind(session_id=session.session_id, client_id=session.client_id)
        # An observation of a new episode can overtake the reset request: either one resets.
        new_episode = not isinstance(item, Rejected) and item.header.episode_id != session.served_episode
        if work.reset or new_episode:
            session.processor.reset()
            if self._exclusive:
                self._runner.policy.reset()
        if not isinstance(item, Rejected):
            session.served_episode = item.header.episode_id
        if isinstance(item, Rejected):
            self._fail(session, item.header, item.code, item.message, queue_wait_ms, 0.0, bound)
            return
        header, delay = item.header, item.delay
        bound = bound.bind(seq_id=header.seq_id, episode_id=header.episode_id)
        bound.debug("inference started", queue_wait_ms=round(queue_wait_ms, 3))
        infer_start = time.monotonic_ns()
        try:
            chunk_model, chunk_robot = self._runner.infer(session.processor, item.obs, delay)
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
        session.served += 1

        def reply() -> None:
            self._reply(work, chunk_model, chunk_robot, queue_wait_ms, inference_ms, decode_ns, bound)

        # With another observation waiting, the device goes straight to it and the reply is
        # published by the reply thread; otherwise publishing here saves a thread hop.
        if self._registry.has_work():
            self._replies.submit(reply)
        else:
            reply()

    def _reply(
        self,
        work: Work,
        chunk_model: FloatArray,
        chunk_robot: FloatArray,
        queue_wait_ms: float,
        inference_ms: float,
        decode_ns: int,
        bound: Logger,
    ) -> None:
        session, item = work.session, work.item
        assert isinstance(item, Decoded)
        header = item.header
        body = ActionChunk(
            chunk_model=encode_tensor(chunk_model),
            chunk_robot=encode_tensor(chunk_robot),
            queue_wait_ms=queue_wait_ms,
            inference_ms=inference_ms,
            superseded=work.superseded,
            server_load=self._state.load,
        )
        # Publish first (the client is waiting), account after; an inference whose session was
        # closed meanwhile is still audited, as undeliverable.
        outcome = "ok" if _publish(session, MSG_CHUNK, encode(body), header, bound) else "undeliverable"
        self._metrics.requests.labels(outcome).inc()
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
            inference_delay=item.delay,
            decode_ms=round(decode_ns / 1e6, 3),
            outcome=outcome,
        )

    def _fail(
        self,
        session: Session,
        header: Header | None,
        code: str,
        message: str,
        queue_wait_ms: float,
        inference_ms: float,
        bound: Logger,
    ) -> None:
        _publish(session, MSG_ERROR, encode(ErrorEvent(code, message)), header, bound)
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


def _publish(session: Session, msg_type: int, body: bytes, request: Header | None, bound: Logger) -> bool:
    if not session.publish(msg_type, body, request):
        # The session was closed by the loop while this request was in flight.
        bound.info("reply not sent: session closed")
        return False
    return True


class ReplyThread:
    """Publishes replies (encode, put, metrics, audit) off the worker's critical path.

    Jobs come from the inference worker; they run on this thread, in order.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="servo-replies", daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the reply thread, after the jobs already submitted."""
        self._jobs.put(job)

    def stop(self, timeout: float) -> None:
        """Run the jobs already submitted, then stop."""
        self._jobs.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except Exception:  # a bug here must cost one reply, never the thread
                log.exception("publishing a reply failed")
