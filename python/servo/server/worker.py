"""The inference worker: the one thread that runs forwards (here, or in the policy process).

The worker's loop is the server's throughput: every microsecond it spends on something other
than a forward pass is device time lost for every client. The data plane is three stages, one
path and one thread each:

* **receive** (the Zenoh observation callback thread, `servo.server.intake`): authenticate,
  admit, decode, deposit into the session's newest-wins mailbox;
* **serve** (this stage thread, "servo-inference", whose one job is the loop): take every
  mailbox not held yet into its `ServiceOrder` (arrival order, a new session's first request
  ahead), let the `Scheduler` pick the group to serve from what it holds, head first
  (round-robin, or a deadline-aware batch for a `BatchingPolicy`, which may linger a few ms
  for partners), claim each member right before the forward (a newer observation of the
  session takes the held one's turn; a reset episode or a closed session drops it) and run
  the forward;
* **reply** (the "servo-reply" thread, `servo.server.replies`): encode, encrypt, put, account, in
  the order the forwards were served, while this thread already runs the next one; with no
  request waiting for the device, this thread publishes the answers itself.

An entry in the worker's queue (every item arrives decoded, or rejected by its decoder)::

    taken ──► select ──► claimed ──forward──► handed to the reply stage
      │          │          │
      │          │          ├── a newer observation arrived: it is served in this turn
      │          │          └── episode reset or session closed: dropped, never answered
      └── Rejected: claimed alone, its error handed to the reply stage
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Hashable
from concurrent.futures import Future

from servo.logs import get_logger
from servo.policy.channel import ChannelClosed
from servo.policy.runner import Forwards
from servo.server.audit import AuditLog
from servo.server.replies import Reply, ReplyStage, queue_wait_ms
from servo.server.scheduler import Scheduler, ServiceOrder
from servo.server.sessions import Claim, Decoded, Mail, Rejected, Session
from servo.server.state import ServerState
from servo.stages import StageThread

log = get_logger(__name__)

#: How often a stopping worker's join looks at the abandon flag.
_JOIN_SLICE_S = 0.05


class _Entry:
    """An observation the worker took from a mailbox. Owned by the inference worker thread.

    ``key`` and ``deadline_ns`` are computed once: the scheduler reads them for every entry of
    its window on every pass.
    """

    def __init__(self, session: Session, item: Mail, fps: float) -> None:
        self.session = session
        self.item = item
        self._fps = fps

    @functools.cached_property
    def key(self) -> Hashable:
        """State and camera shapes: observations with equal keys stack into one forward."""
        item = self.item
        if isinstance(item, Rejected):
            return id(self)  # matches nothing: served alone
        obs = item.obs
        return obs.state.shape, tuple((name, tuple(frame.shape)) for name, frame in obs.images.items())

    @functools.cached_property
    def deadline_ns(self) -> int | None:
        """When the client expects the chunk: its inference delay after the observation arrived."""
        item = self.item
        if isinstance(item, Rejected) or item.delay <= 0:
            return None
        return item.received_ns + int(item.delay * 1e9 / self._fps)


class InferenceWorker:
    """Serves decoded observations, alone or in batches, in the order the scheduler picks.

    Owns the `Forwards` (the policy on its device, here or in its process), every session's
    processor and the reply stage;
    runs as the one long job of its own stage thread, so the event loop never waits on a forward.
    Started and stopped by the event loop (`stop` from a worker thread of the loop: it joins).
    """

    def __init__(self, runner: Forwards, state: ServerState, scheduler: Scheduler, audit: AuditLog) -> None:
        self._runner = runner
        self._registry = state.registry
        self._scheduler = scheduler
        self._metrics = state.metrics
        self._exclusive = state.replica.exclusive
        self._fps = runner.spec.fps
        self._state = state
        self._audit = audit
        self._stage: StageThread | None = None
        self._replies: ReplyStage | None = None
        #: Set when the worker is told to stop (its stage's ``closing``).
        self._stopping = threading.Event()
        self._queue: ServiceOrder[_Entry] = ServiceOrder()
        self._device_free_ns = 0  # when the last forward ended
        #: Times round the worker's loop (read by other threads: a health signal, see `turns`).
        self._turns = 0

    def start(self) -> None:
        """Start the worker and reply stages."""
        self._replies = ReplyStage(self._state, self._audit)
        self._stage = StageThread("servo-inference")
        self._stopping = self._stage.closing
        self._stage.submit(self._run).add_done_callback(_crashed)

    def stop(self, timeout: float, *, abandon: threading.Event | None = None) -> bool:
        """Finish the forward in flight and publish every reply handed over, then stop.

        Returns False if the forward did not finish within ``timeout`` s, or ``abandon`` was set
        first (the forward then runs on in its daemon thread, unanswered).
        """
        stage, replies = self._stage, self._replies
        assert stage is not None, "start() first"
        assert replies is not None
        stage.close()  # sets ``closing``: the loop ends after the forward in flight
        self._registry.close()
        deadline = time.monotonic() + timeout
        while stage.alive and time.monotonic() < deadline and not (abandon and abandon.is_set()):
            stage.join(_JOIN_SLICE_S)
        finished = not stage.alive
        if finished:
            replies.close(max(0.0, deadline - time.monotonic()))
        return finished

    @property
    def turns(self) -> int:
        """Times round the worker's loop so far (any thread).

        At least every 0.25 s when idle, after each forward when busy; a hung forward stops it.
        """
        return self._turns

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._turns += 1
            if not self._queue and not self._registry.wait_ready(timeout=0.25):
                continue
            if taken := self._registry.take():
                sessions = len(self._registry)
                for session, item in taken:
                    # A session never served yet: its robot is waiting for its first chunk.
                    first = isinstance(item, Decoded) and session.served_episode < 0
                    self._queue.push(_Entry(session, item, self._fps), first=first, limit=sessions)
            if not self._queue:
                continue
            try:
                self._serve_next()
            except Exception:  # a bug here must cost one group, never the worker thread
                log.exception("request handling failed")

    def _serve_next(self) -> None:
        head = self._queue.head()
        group = [head]
        if isinstance(head.item, Decoded):
            window = itertools.islice(self._queue, self._scheduler.max_batch)
            decoded = [e for e in window if isinstance(e.item, Decoded)]
            now_ns = time.monotonic_ns()
            group = self._scheduler.select(decoded, now_ns)
            since_ns = max(head.item.ready_ns, self._device_free_ns)
            linger = self._scheduler.linger_s(group, len(self._registry), since_ns, now_ns)
            if linger > 0 and not self._stopping.is_set():
                self._registry.wait_ready(linger)  # an arrival ends it: take, select again
                return
        for entry in group:
            self._queue.remove(entry)
        claimed = [(e.session, claim) for e in group if (claim := self._registry.claim(e.session, e.item)) is not None]
        served = [(session, claim) for session, claim in claimed if isinstance(claim.item, Decoded)]
        refused = [(session, claim) for session, claim in claimed if isinstance(claim.item, Rejected)]
        if refused:
            now_ns = time.monotonic_ns()
            for session, claim in refused:
                self._begin(session, claim)
            self._reply([Reply(s, c, None, queue_wait_ms(c.item, now_ns), 0.0, 1) for s, c in refused])
        if served:
            self._forward(served)

    def _begin(self, session: Session, claim: Claim) -> None:
        """Episode bookkeeping before serving.

        An observation of a new episode can overtake the reset request: either one resets.
        """
        item = claim.item
        new_episode = isinstance(item, Decoded) and item.header.episode_id != session.served_episode
        if claim.reset or new_episode:
            session.processor.reset()
            if self._exclusive:
                self._runner.reset_policy()
        if isinstance(item, Decoded):
            session.served_episode = item.header.episode_id

    def _forward(self, served: list[tuple[Session, Claim]]) -> None:
        start_ns = time.monotonic_ns()
        requests = []
        waits = []
        for session, claim in served:
            item = claim.item
            assert isinstance(item, Decoded)
            self._begin(session, claim)
            requests.append((session.processor, item.obs, item.delay))
            waits.append(queue_wait_ms(item, start_ns))
            log.debug(
                "inference started",
                session_id=session.session_id,
                seq_id=item.header.seq_id,
                queue_wait_ms=round(waits[-1], 3),
                batch=len(served),
            )
        try:
            outcomes = self._runner.infer_batch(requests)
        except ChannelClosed:
            if self._stopping.is_set():  # abandoned at stop, its policy process closed under it
                return
            raise
        self._device_free_ns = time.monotonic_ns()
        inference_ms = (self._device_free_ns - start_ns) / 1e6
        self._scheduler.record(len(served), inference_ms / 1e3)
        self._metrics.batch_size.observe(len(served))
        self._reply(
            [
                Reply(session, claim, outcome, wait, inference_ms, len(served))
                for (session, claim), outcome, wait in zip(served, outcomes, waits, strict=True)
            ]
        )

    def _reply(self, replies: list[Reply]) -> None:
        assert self._replies is not None
        # Nothing waits for the device: this thread answers (`servo.server.replies`).
        self._replies.submit(replies, here=not self._queue and not self._registry.has_ready())


def _crashed(done: Future[None]) -> None:
    """The loop's future: it only ever ends with the stage (an exception here is a bug, logged)."""
    if (error := done.exception()) is not None:
        log.error("inference worker crashed", exc_info=error)
