"""The inference worker: the one thread that owns the policy and the device.

The worker's loop is the server's throughput: every microsecond it spends on something other
than a forward pass is device time lost for every client. One worker thread and one executor
thread ("servo-io", FIFO):

* an observation deposited while a forward runs starts decoding on the executor at once
  (`deposit`), so the next groups are decoded during the current forward (prefetch); an idle
  worker is woken instead and decodes it itself (no thread hop). Before each forward the
  worker takes every mailbox it does not hold yet (`SessionRegistry.take`) and waits only for
  the decodes of the entries the scheduler may group (the head alone for round-robin), doing
  any the executor has not started itself;
* the `Scheduler` picks the group to serve from the decoded entries, head first (round-robin,
  or a deadline-aware batch for a `BatchingPolicy`, which may linger a few ms for partners);
* each member is claimed right before the forward: one superseded by a newer observation,
  reset past its episode or closed meanwhile is dropped, never answered;
* the replies (encode, put, metrics, audit) go to the executor when more work is waiting, so the
  next forward starts at once, and leave in the order they were served; an idle worker
  publishes inline (one thread hop less).

One executor thread, not two: in paired runs against the previous data plane
(``benches/bench_batching.py``'s fixed policy: 20 ms forwards, 16 client processes over TCP on
127.0.0.1, shared 2-core box) two threads served 0.5-2.3 percentage points less of the ideal
50 chunks/s, one thread 0-1 point, and one keeps replies in order (the JPEG decoder still
decodes an observation's cameras in parallel).

An entry in the worker's queue::

    taken ──decoded (executor or worker)──► select ──► claimed ──forward──► replied
      │                              │                   │
      └── decode failed: Rejected ───┴── served alone    └── refused: dropped (newer, reset, closed)
                                         as an error
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from servo._core import MSG_CHUNK, MSG_ERROR, Header
from servo.logs import Logger, LogThrottle, get_logger
from servo.policy.protocol import FloatArray
from servo.policy.runner import InferenceRunner
from servo.server.audit import AuditLog
from servo.server.decoding import ObservationDecoder
from servo.server.scheduler import Scheduler
from servo.server.sessions import Claim, Decoded, Deposit, Pending, Rejected, Session
from servo.server.state import ServerState
from servo.wire import ActionChunk, ErrorEvent, encode, encode_tensor

log = get_logger(__name__)

#: How often a stopping worker's join looks at the abandon flag.
_JOIN_SLICE_S = 0.05
#: Refused requests and policy failures: one log line per code per second, with the count held back.
_THROTTLE = LogThrottle(1.0)


class _Entry:
    """An observation the worker took from a mailbox, with its decode in flight or done.

    Owned by the inference worker thread (the executor only resolves ``pending.decoded``).
    ``key`` and ``deadline_ns`` are computed once: the scheduler reads them for every entry of
    its window on every pass.
    """

    def __init__(self, session: Session, pending: Pending, fps: float) -> None:
        self.session = session
        self.pending = pending
        self._fps = fps

    @property
    def item(self) -> Decoded | Rejected:
        """The decoded observation (waits for the decode: start it first)."""
        return self.pending.decoded.result()

    @functools.cached_property
    def key(self) -> Hashable:
        """State and camera shapes: observations with equal keys stack into one forward."""
        item = self.item
        if isinstance(item, Rejected):
            return id(self)  # matches nothing: served alone
        obs = item.obs
        return obs.state.shape, tuple((name, frame.shape) for name, frame in obs.images.items())

    @property
    def received_ns(self) -> int:
        """When the observation arrived."""
        return self.pending.received_ns

    @functools.cached_property
    def deadline_ns(self) -> int | None:
        """When the client expects the chunk: its inference delay after the observation arrived."""
        item = self.item
        if isinstance(item, Rejected) or item.delay <= 0:
            return None
        return item.received_ns + int(item.delay * 1e9 / self._fps)


class InferenceWorker:
    """Serves decoded observations, alone or in batches, in the order the scheduler picks.

    Owns the `InferenceRunner` (policy, device), every session's processor and a one-thread
    executor for decodes and replies; runs on its own thread so the event loop never waits on a forward.
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
        self._fps = runner.policy.spec.fps
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="servo-inference", daemon=True)
        self._decode = ObservationDecoder(
            runner.policy.spec, max_observation_bytes=max_observation_bytes, pin_task=state.replica.info.pin_task
        )
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="servo-io")
        self._queue: deque[_Entry] = deque()
        self._replies: list[Future[None]] = []
        self._device_free_ns = 0  # when the last forward ended
        # Written by the worker around forwards, read by deposits: a stale read costs one
        # redundant submit or one decode done by the worker instead, nothing more.
        self._forwarding = False

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def stop(self, timeout: float, *, abandon: threading.Event | None = None) -> bool:
        """Finish the forward in flight and publish its replies, then stop.

        Returns False if the forward did not finish within ``timeout`` s, or ``abandon`` was set
        first (the forward then runs on in its daemon thread, unanswered).
        """
        self._stop.set()
        self._registry.close()
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and time.monotonic() < deadline and not (abandon and abandon.is_set()):
            self._thread.join(_JOIN_SLICE_S)
        finished = not self._thread.is_alive()
        if finished:
            for reply in list(self._replies):
                reply.exception(max(0.0, deadline - time.monotonic()))  # waits; failures were logged
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._decode.close()
        return finished

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._queue and not self._registry.wait_ready(timeout=0.25):
                continue
            self._prefetch()
            if not self._queue:
                continue
            try:
                self._serve_next()
            except Exception:  # a bug here must cost one group, never the worker thread
                log.exception("request handling failed")

    def deposit(self, session: Session, pending: Pending) -> Deposit:
        """Put an authenticated observation in its session's mailbox; start decoding it.

        Called on a Zenoh callback thread. The decode runs on the executor, so the observation
        is ready when its turn comes (prefetch) — unless the worker is idle and decodes it at once.
        """
        outcome = self._registry.deposit(session, pending)
        # An idle worker wakes up and decodes it itself: no thread hop, no race for the GIL.
        if outcome == "ok" and self._forwarding:
            with contextlib.suppress(RuntimeError):  # stopped: nothing will be served any more
                self._executor.submit(self._decode_once, pending, session)
        return outcome

    def _decode_once(self, pending: Pending, session: Session) -> None:
        """Decode unless the executor or the worker started first (or it was dropped)."""
        if pending.start():
            pending.decoded.set_result(self._decode(pending, session))

    def _prefetch(self) -> None:
        """Take every mailbox not held yet (their decodes started on arrival)."""
        for session, pending in self._registry.take():
            self._queue.append(_Entry(session, pending, self._fps))

    def _ready(self, entry: _Entry) -> Decoded | Rejected:
        """The entry's decoded observation; decoded here if the executor has not started it."""
        self._decode_once(entry.pending, entry.session)
        return entry.item

    def _serve_next(self) -> None:
        head = self._queue[0]
        if isinstance(self._ready(head), Rejected):
            group = [head]
        else:
            # The decodes of the entries the scheduler may group: mostly done already (they
            # started when the observations arrived, during the last forward); the executor
            # takes the rest while this thread decodes too.
            window = list(itertools.islice(self._queue, self._scheduler.max_batch))
            for entry in window[1:]:
                if not entry.pending.started:
                    self._executor.submit(self._decode_once, entry.pending, entry.session)
            decoded = [e for e in window if isinstance(self._ready(e), Decoded)]
            now_ns = time.monotonic_ns()
            group = self._scheduler.select(decoded, now_ns)
            since_ns = max(head.received_ns, self._device_free_ns)
            linger = self._scheduler.linger_s(group, len(self._registry), since_ns, now_ns)
            if linger > 0 and not self._stop.is_set():
                self._registry.wait_ready(linger)  # an arrival ends it: prefetch, select again
                return
        for entry in group:
            self._queue.remove(entry)
        claimed = [(e, claim) for e in group if (claim := self._registry.claim(e.session, e.item)) is not None]
        if not claimed:
            return
        if isinstance(head.item, Rejected):
            entry, claim = claimed[0]
            self._refuse(entry, claim)
        else:
            self._forward(claimed)

    def _refuse(self, entry: _Entry, claim: Claim) -> None:
        item = entry.item
        assert isinstance(item, Rejected)
        self._begin(entry.session, item, claim)
        queue_wait_ms = (time.monotonic_ns() - item.received_ns) / 1e6
        bound = log.bind(session_id=entry.session.session_id, client_id=entry.session.client_id)
        self._fail(entry.session, item.header, item.code, item.message, queue_wait_ms, 0.0, bound)

    def _begin(self, session: Session, item: Decoded | Rejected, claim: Claim) -> None:
        """Episode bookkeeping before serving.

        An observation of a new episode can overtake the reset request: either one resets.
        """
        new_episode = not isinstance(item, Rejected) and item.header.episode_id != session.served_episode
        if claim.reset or new_episode:
            session.processor.reset()
            if self._exclusive:
                self._runner.policy.reset()
        if not isinstance(item, Rejected):
            session.served_episode = item.header.episode_id

    def _forward(self, claimed: list[tuple[_Entry, Claim]]) -> None:
        start_ns = time.monotonic_ns()
        requests = []
        for entry, claim in claimed:
            item = entry.item
            assert isinstance(item, Decoded)
            self._begin(entry.session, item, claim)
            requests.append((entry.session.processor, item.obs, item.delay))
            # Time spent waiting, not decoding: decoding is neither queue wait nor inference.
            queue_wait_ms = (start_ns - item.received_ns - item.decode_ns) / 1e6
            log.debug(
                "inference started",
                session_id=entry.session.session_id,
                seq_id=item.header.seq_id,
                queue_wait_ms=round(queue_wait_ms, 3),
                batch=len(claimed),
            )
        self._forwarding = True
        try:
            outcomes = self._runner.infer_batch(requests)
        finally:
            self._forwarding = False
        self._device_free_ns = time.monotonic_ns()
        inference_ms = (self._device_free_ns - start_ns) / 1e6
        self._scheduler.record(len(claimed), inference_ms / 1e3)
        self._metrics.batch_size.observe(len(claimed))
        jobs = [
            self._reply_job(entry, claim, outcome, start_ns, inference_ms, len(claimed))
            for (entry, claim), outcome in zip(claimed, outcomes, strict=True)
        ]

        def publish() -> None:
            for job in jobs:
                try:
                    job()
                except Exception:  # a bug here must cost one reply, never the others
                    log.exception("publishing a reply failed")

        # With another observation waiting, the device goes straight to it and the replies are
        # published on the executor; otherwise publishing here saves a thread hop.
        if self._queue or self._registry.has_ready():
            self._replies = [f for f in self._replies if not f.done()]
            self._replies.append(self._executor.submit(publish))
        else:
            publish()

    def _reply_job(
        self,
        entry: _Entry,
        claim: Claim,
        outcome: tuple[FloatArray, FloatArray] | Exception,
        start_ns: int,
        inference_ms: float,
        batch: int,
    ) -> Callable[[], None]:
        session, item = entry.session, entry.item
        assert isinstance(item, Decoded)
        queue_wait_ms = (start_ns - item.received_ns - item.decode_ns) / 1e6
        bound = log.bind(
            session_id=session.session_id,
            client_id=session.client_id,
            seq_id=item.header.seq_id,
            episode_id=item.header.episode_id,
        )
        if isinstance(outcome, Exception):
            exc = outcome

            def fail() -> None:
                if (suppressed := _THROTTLE.allow("inference_failed")) is not None:
                    bound.error("inference failed", exc_info=exc, batch=batch, suppressed=suppressed)
                message = f"{type(exc).__name__}: {exc}"
                self._fail(session, item.header, "inference_failed", message, queue_wait_ms, inference_ms, bound)

            return fail
        chunk_model, chunk_robot = outcome
        return lambda: self._reply(session, item, claim, chunk_model, chunk_robot, queue_wait_ms, inference_ms, bound)

    def _reply(
        self,
        session: Session,
        item: Decoded,
        claim: Claim,
        chunk_model: FloatArray,
        chunk_robot: FloatArray,
        queue_wait_ms: float,
        inference_ms: float,
        bound: Logger,
    ) -> None:
        header = item.header
        # Identity post-processing ships one tensor (the edge then uses chunk_robot for both).
        same = chunk_model is chunk_robot or np.array_equal(chunk_model, chunk_robot)
        body = ActionChunk(
            chunk_robot=encode_tensor(chunk_robot),
            chunk_model=None if same else encode_tensor(chunk_model),
            queue_wait_ms=queue_wait_ms,
            inference_ms=inference_ms,
            superseded=claim.superseded,
            server_load=self._state.load,
        )
        # Publish first (the client is waiting), account after; an inference whose session was
        # closed meanwhile is still audited, as undeliverable.
        outcome = "ok" if _publish(session, MSG_CHUNK, encode(body), header, bound) else "undeliverable"
        self._metrics.requests.labels(outcome).inc()
        self._metrics.superseded.inc(claim.superseded)
        self._metrics.queue_wait_ms.observe(queue_wait_ms)
        self._metrics.inference_ms.observe(inference_ms)
        self._audit.write(
            session_id=session.session_id,
            client_id=session.client_id,
            seq_id=header.seq_id,
            episode_id=header.episode_id,
            queue_wait_ms=round(queue_wait_ms, 3),
            inference_ms=round(inference_ms, 3),
            superseded=claim.superseded,
            inference_delay=item.delay,
            decode_ms=round(item.decode_ns / 1e6, 3),
            outcome=outcome,
        )

    def _fail(
        self,
        session: Session,
        header: Header,
        code: str,
        message: str,
        queue_wait_ms: float,
        inference_ms: float,
        bound: Logger,
    ) -> None:
        _publish(session, MSG_ERROR, encode(ErrorEvent(code, message)), header, bound)
        self._metrics.requests.labels(code).inc()
        if (suppressed := _THROTTLE.allow(code)) is not None:
            bound.warning("request refused", code=code, reason=message, suppressed=suppressed)
        self._audit.write(
            session_id=session.session_id,
            client_id=session.client_id,
            seq_id=header.seq_id,
            episode_id=header.episode_id,
            queue_wait_ms=round(queue_wait_ms, 3),
            inference_ms=round(inference_ms, 3),
            outcome=code,
        )


def _publish(session: Session, msg_type: int, body: bytes, request: Header, bound: Logger) -> bool:
    if not session.publish(msg_type, body, request):
        # The session was closed by the loop while this request was in flight.
        bound.info("reply not sent: session closed")
        return False
    return True
