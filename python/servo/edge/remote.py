"""The remote engine: chunks from a policy server over Zenoh. Never imports torch."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import uuid

import anyio
import zenoh

from servo.client import (
    NoServerFound,
    PolicyClient,
    RemoteSession,
    RequestTimeout,
    ServerError,
    ServerInfo,
    SessionLost,
    SessionRejected,
    UntrustedServer,
)
from servo.client.options import SessionOptions
from servo.client.policy_client import RETRYABLE
from servo.edge.backoff import Backoff
from servo.edge.config import EdgeConfig
from servo.edge.engine import EngineBase
from servo.edge.errors import EdgeStartError
from servo.edge.failures import SessionEnded
from servo.edge.link import no_server, open_link, prepare_join
from servo.edge.observation import robot_features
from servo.edge.pipeline import Produced, Request
from servo.edge.replicas import ReplicaRules
from servo.edge.stats import EngineStats
from servo.logs import get_logger
from servo.robots.protocol import RobotSpec
from servo.wire import alive_selector, slugify

log = get_logger(__name__)


class RemoteEngine(EngineBase):
    """Streams observations to a policy server and merges the chunks it returns.

    The engine loop (the network worker) belongs to the event loop and does all encoding and
    I/O; the control loop only deposits observations and pops the queue. One request is in flight
    at a time: the next observation leaves when the queue would run dry before its chunk is back.

    Every chunk is authenticated and validated by the client library before it can reach the
    queue (`servo.client.verify`); a rejected one is counted, and the request retried. Only the
    spec's reasons kill the engine (docs/design/failsafe.md §2): offline longer than ``max_offline_s``, or a
    server that comes back with another model or refuses the robot's capabilities.

    Failover is driven by events, not timers: a lost session (the replica's liveliness token
    vanished, a drain notice, a timeout streak, a server that forgot the session) re-handshakes
    at once on the best usable replica while the fallback ladder holds the arm. Only when nobody
    usable answers does the engine back off, and a replica token appearing (a restarted or new
    server) ends that wait at once; while streaming, it is a placement look (`_rebalance`).
    """

    def __init__(self, config: EdgeConfig, spec: RobotSpec) -> None:
        # A robot that joins is enrolled under its name: this machine's, the same at every start
        # and for every robot command run here (the sim first, then the arm).
        default = slugify(socket.gethostname()) if config.security.join else f"{spec.name}-{uuid.uuid4().hex[:8]}"
        super().__init__(config, spec, client_id=config.resolved_client_id(default))
        self.features = robot_features(spec)
        self.server: ServerInfo | None = None
        self.session: RemoteSession | None = None
        self.client: PolicyClient | None = None
        #: The last session opened: a reconnect proves it held it (see `PolicyClient.open_session`).
        self._previous: RemoteSession | None = None
        self.rules = ReplicaRules()
        self._epoch = 0
        #: A session opened on a replica that appeared, to switch to between two requests.
        self._moved: RemoteSession | None = None
        self._readers: tuple[bytes, ...] = ()
        self._rebalancing = False
        self._receive_scope: anyio.CancelScope | None = None
        #: Set when a replica's liveliness token appears: ends a reconnect backoff at once.
        self._replica_appeared = anyio.Event()

    # ------------------------------------------------------------------ control-loop side
    def reset(self) -> None:
        """Episode boundary: local reset at once, acked server reset in the background."""
        super().reset()
        if self._bridge is not None:
            self._bridge.call(self._start_server_reset)

    # ------------------------------------------------------------------ worker (event loop)
    async def start(self) -> None:
        """Join Zenoh and open the first session (``started`` follows).

        Raises:
            EdgeStartError: no usable server within ``connect_timeout_s``, or the server refused
                the robot's capabilities.
        """
        self.config = await prepare_join(self.config)
        zsession = self.zenoh_session = await open_link(self.config, self.resources)
        watcher = self._watch_replicas(zsession)
        self.resources.callback(_undeclare, watcher)
        # Telling the server is a courtesy (it collects vanished clients anyway); first to run.
        self.resources.push_async_callback(self._close_session)
        self.client = PolicyClient(
            zsession,
            self.client_id,
            jpeg_quality=self.config.link.jpeg_quality,
            auto_codec=self.config.link.auto_codec(),
            trusted=self.config.security.trusted(),
            max_chunk_steps=self.config.security.max_chunk_steps,
            identity=await anyio.to_thread.run_sync(self.config.security.identity),
            known=self.config.security.known(),
            join=self.config.security.join_token(),
        )
        await self._first_session(self.client)

    async def _close_session(self) -> None:
        if self.session is not None:
            await self.session.close(timeout=0.01 if self.hurried else 0.5)

    def _backoff(self, *, deadline_s: float | None = None) -> Backoff:
        link = self.config.link
        return Backoff(link.reconnect_initial_backoff_s, link.reconnect_max_backoff_s, deadline_s=deadline_s)

    def _watch_replicas(self, zsession: zenoh.Session) -> zenoh.Subscriber[None]:
        """Liveliness of every replica this edge may use: a new token ends a reconnect backoff.

        The callback only deposits (`servo.stages.LoopBridge`), on a thread of its own (one for
        the edge's life) rather than `direct`: with `direct` the settle test (three edges, a
        replica appears) failed 3 of 5 runs, traced to placement, not threads. The edges saw the
        token within 8 ms of each other, their looks all counted the same census (a: 3, b: 0)
        and two or three moved where one was needed: a herd. A thread hop spreads the reactions
        and hid it; `direct` is right once placement moves only the robots needed.
        """
        bridge = self._bridge
        assert bridge is not None
        server = self.config.server
        return zsession.liveliness().declare_subscriber(
            alive_selector(server.app or None, server.model or None),
            lambda sample: bridge.call(self._on_replica_liveliness, sample.kind),
        )

    def _on_replica_liveliness(self, kind: zenoh.SampleKind) -> None:
        if kind == zenoh.SampleKind.PUT:
            self._replica_appeared.set()
            self._settle_soon()  # a (re)started replica is settled onto like a new session

    def _settle_soon(self) -> None:
        """Run the placement looks in the background (`_rebalance`), unless they already run."""
        if self.session is not None and self._tasks is not None and not self._rebalancing:
            self._rebalancing = True
            self._tasks.start_soon(self._rebalance, self.session)

    async def _rebalance(self, session: RemoteSession) -> None:
        """Look at the fleet; when this edge should move, open the session it moves to (`_moved`).

        Runs beside the stream: after every new session (whose first request left at once) and
        when a replica appears. Only for chunk-stateless policies: a move mid-episode loses the
        server-side processor's state, as a failover does.
        """
        client, identity = self.client, self.rules.identity
        try:
            if client is None or identity is None or not identity.chunk_stateless:
                return
            server = self.config.server
            moved = await client.rebalance(
                session,
                features=self.features,
                fps=self.spec.fps,
                app=server.app or None,
                model=server.model or None,
                accept=self._acceptable,
                **self._placement(self._epoch + 1),
            )
        finally:
            self._rebalancing = False
        if moved is None:
            return
        if self.session is not session or session.lost.is_set() or self.tearing_down:
            await moved.close()
            return
        log.info("moving to a less loaded replica", client_id=self.client_id, to=moved.server.keys.replica)
        self._moved = moved

    async def _first_session(self, client: PolicyClient) -> None:
        backoff = self._backoff(deadline_s=self.config.link.connect_timeout_s)
        while True:
            try:
                await self._open(client)
                return
            except SessionRejected as exc:
                if exc.rejection.code not in RETRYABLE:
                    raise EdgeStartError(f"server refused this robot: {exc.rejection.reason}", refused=True) from None
                problem = str(exc)
            except UntrustedServer as exc:
                raise EdgeStartError(str(exc), refused=True) from None
            except (NoServerFound, RequestTimeout) as exc:
                problem = str(exc)
            if not await backoff.wait():
                raise no_server(self.config, problem)

    def _placement(self, epoch: int) -> SessionOptions:
        """How `PolicyClient.connect_best` and `PolicyClient.rebalance` open this edge's sessions."""
        cfg = self.config
        return SessionOptions(
            task=cfg.task,
            rtc=cfg.pipeline.rtc,
            epoch=epoch,
            tags=dict(cfg.tags),
            timeout=min(2.0, cfg.failsafe.request_timeout_s),
        )

    async def _open(self, client: PolicyClient) -> None:
        self._epoch += 1
        server, options = self.config.server, self._placement(self._epoch)
        options["previous"] = old = self._previous
        # Settled later (`_adopt`); after a loss the other replicas known go first, without discovery.
        session = await client.connect_best(
            features=self.features,
            fps=self.spec.fps,
            app=server.app or None,
            model=server.model or None,
            accept=self._acceptable,
            settle=False,
            avoid=(old.server.keys,) if old is not None and old.lost.is_set() else (),
            **options,
        )
        await self._adopt(session)

    async def _adopt(self, session: RemoteSession) -> None:
        """Use a newly opened session, if the replica rules allow it (raises `SessionEnded` if not)."""
        self._previous = session
        self._epoch = max(self._epoch, session.epoch)
        assert session.ack is not None
        ack = session.ack
        refused = self.rules.refusal(
            self.config.server, session.server, ack.policy, episode_starting=self.episode_starting
        )
        if refused is not None:
            reason, fatal = refused
            await session.close()  # a replica mid-upgrade, or (fatal) another model
            if fatal:
                self.failsafe.fatal(reason)
            raise SessionEnded(reason)
        self.rules.identity = ack.policy
        self._readers = tuple(ack.operators)
        self.tuning = ack.policy.tuning
        self.task = ack.task  # the effective task (the server's default when the edge names none)
        self.server, self.session = session.server, session
        self.log = self.failures.log = log.bind(session_id=session.session_id, client_id=self.client_id)
        session.episode_id = self.pipeline.episode_id
        if self.pipeline.queue.empty():
            self.pipeline.set_rtc(ack.rtc)
        self.failsafe.session_opened()
        # Before any chunk: the round trip measured so far, else at least the replica's forward.
        forward_ns = round(session.server.status.inference_ms * 1e6)
        self.check_chunk_length(ack.policy.chunk_size, self.pipeline.expected_latency_ns() or forward_ns or None)
        for warning in ack.warnings:
            log.warning("server warning", session_id=session.session_id, client_id=self.client_id, warning=warning)
        self._settle_soon()

    def _acceptable(self, server: ServerInfo) -> bool:
        """Whether this edge may use ``server`` now (`ReplicaRules.acceptable`)."""
        return self.rules.acceptable(self.config.server, server, episode_starting=self.episode_starting)

    async def serve(self) -> None:
        """The engine loop on each session in turn, until DEAD or the teardown.

        A lost session re-handshakes at once; the engine backs off only while nobody usable answers.
        """
        assert self.client is not None
        client = self.client
        backoff = self._backoff()
        while not self.failsafe.dead.is_set():
            if (session := self.session) is not None:
                try:
                    # A new session asks at once: the queue holds the last replica's chunk
                    # (failover, drain, restart, a move) or nothing; only a chunk of this session is fresh.
                    await self.stream(lambda: self._ended(session), at_once=True)
                except SessionEnded as exc:
                    if self._moved is None or session.lost.is_set():
                        self.failsafe.lost(str(exc))  # a move is no loss: the arm runs on the queue
                with anyio.CancelScope(shield=True):
                    await session.close()
                self.session = None
                backoff.reset()
            moved, self._moved = self._moved, None
            if self.failsafe.dead.is_set() or self.tearing_down:
                if moved is not None:
                    await moved.close()
                return  # the arm is parking: nothing may start a session now
            if moved is not None:
                with contextlib.suppress(SessionEnded):  # refused: open one as after any loss
                    await self._adopt(moved)
                    continue
            # A token that appears while this attempt runs must still cut the next wait short.
            appeared = self._replica_appeared = anyio.Event()
            try:
                await self._open(client)
                continue
            except SessionRejected as exc:
                if exc.rejection.code not in RETRYABLE:
                    self.failsafe.fatal(f"server refused this robot on reconnect: {exc.rejection.reason}")
                    continue
                problem = str(exc)
            except (NoServerFound, RequestTimeout, SessionEnded) as exc:
                problem = str(exc)
            delay = backoff.next_delay()
            assert delay is not None  # no deadline: always a delay
            log.info("reconnect attempt failed", client_id=self.client_id, error=problem, retry_in_s=delay)
            with anyio.move_on_after(delay):
                await appeared.wait()

    def _ended(self, session: RemoteSession) -> str | None:
        """Why the engine leaves ``session`` (lost, or a move to `_moved`), or None."""
        if session.lost.is_set():
            return session.lost_reason
        return None if self._moved is None else f"moving to replica {self._moved.server.keys.replica}"

    async def produce(self, request: Request, *, episode_start: bool) -> Produced | None:
        """Send the request's observation and wait for its chunk (None: abandoned by a reset).

        Raises:
            RequestTimeout, ServerError, SessionLost: from the session.
        """
        session = self.session
        assert session is not None
        obs = request.obs
        seq = await session.send(
            obs.state,
            obs.images,
            mono_ns=obs.mono_ns,
            task=obs.task,
            inference_delay_steps=request.delay_steps,
            prefix_model=request.prefix_model,
            prefix_robot=request.prefix_robot,
            episode_start=episode_start,
        )
        self.requests += 1
        self.network_requests += 1
        self.failsafe.request_sent()
        with anyio.CancelScope() as scope:
            self._receive_scope = scope
            # An answer overdue by a few round trips is most likely lost, not late: it is asked
            # for again long before the request timeout (`RemoteSession.resend`). Measured
            # against the slowest recent one, so that a replica's queue growing costs one copy.
            resend_after = session.resend_after(self.pipeline.recent.max())
            result = await session.receive(
                seq, timeout=self.config.failsafe.request_timeout_s, resend_after=resend_after
            )
        self._receive_scope = None
        if scope.cancel_called:
            return None
        return Produced(result.chunk_model, result.chunk_robot, session.session_id, result.seq_id, result.inference_ms)

    def _start_server_reset(self) -> None:
        session, episode = self.session, self.pipeline.episode_id
        if self._receive_scope is not None:
            self._receive_scope.cancel()
        if session is not None and self._tasks is not None:
            self._tasks.start_soon(self._server_reset, session, episode)

    async def _server_reset(self, session: RemoteSession, episode_id: int) -> None:
        try:
            await session.reset(episode_id, timeout=1.0)
        except (RequestTimeout, ServerError, SessionLost) as exc:
            # The server holds no state the edge depends on; the episode id in the header suffices.
            log.warning("server reset not acknowledged", session_id=session.session_id, error=str(exc))

    def statistics(self) -> EngineStats:
        """Counters snapshot, with client-side refusals and the current session's codec choice."""
        stats = super().statistics()
        if self.client is None:
            return stats
        refused = self.client.statistics()
        return dataclasses.replace(
            stats,
            chunks_rejected=refused.chunks_rejected,
            rogue_servers=refused.rogue_servers,
            resent=refused.resent,
            codec=None if self.session is None else self.session.codec_status(),
            replica="" if self.session is None else self.session.server.keys.replica,
            model="" if self.session is None else self.session.server.keys.model,
            readers=self._readers,
        )


def _undeclare(watcher: zenoh.Subscriber[None]) -> None:
    with contextlib.suppress(zenoh.ZError):
        watcher.undeclare()
