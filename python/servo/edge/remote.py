"""The remote engine: chunks from a policy server over Zenoh. Never imports torch."""

from __future__ import annotations

import contextlib
import dataclasses
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
)
from servo.client.policy_client import RETRYABLE
from servo.edge.backoff import Backoff
from servo.edge.config import EdgeConfig
from servo.edge.engine import EngineBase, Produced
from servo.edge.errors import EdgeStartError
from servo.edge.failures import SessionEnded
from servo.edge.observation import robot_features
from servo.edge.pipeline import Request
from servo.edge.stats import EngineStats
from servo.logs import get_logger
from servo.robots.protocol import RobotSpec
from servo.transport import open_session
from servo.wire import PolicyInfo, alive_selector

log = get_logger(__name__)


class RemoteEngine(EngineBase):
    """Streams observations to a policy server and merges the chunks it returns.

    The engine loop (the network worker) belongs to the event loop and does all encoding and
    I/O; the control loop only deposits observations and pops the queue. One request is in flight
    at a time: the next observation leaves when the queue would run dry before its chunk is back.

    Every chunk is authenticated and validated by the client library before it can reach the
    queue (`servo.client.verify`); a rejected one is counted, and the request retried. Only the
    spec's reasons kill the engine (seeds/001 §9.2): offline longer than ``max_offline_s``, or a
    server that comes back with another model or refuses the robot's capabilities.

    Failover is driven by events, not timers: a lost session (the replica's liveliness token
    vanished, a drain notice, a timeout streak, a server that forgot the session) re-handshakes
    at once on the best usable replica while the fallback ladder holds the arm. Only when nobody
    usable answers does the engine back off, and a replica token appearing (a restarted or new
    server) ends that wait at once.
    """

    def __init__(self, config: EdgeConfig, spec: RobotSpec) -> None:
        super().__init__(config, spec, client_id=config.resolved_client_id(f"{spec.name}-{uuid.uuid4().hex[:8]}"))
        self.features = robot_features(spec)
        self.server: ServerInfo | None = None
        self.session: RemoteSession | None = None
        self.client: PolicyClient | None = None
        #: The last session opened: a reconnect proves it held it (see `PolicyClient.open_session`).
        self._previous: RemoteSession | None = None
        self._identity: PolicyInfo | None = None
        self._epoch = 0
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
        zsession = self.zenoh_session = await self._open_zenoh()
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
        )
        await self._first_session(self.client)

    async def _close_session(self) -> None:
        if self.session is not None:
            await self.session.close(timeout=0.01 if self.hurried else 0.5)

    def _backoff(self, *, deadline_s: float | None = None) -> Backoff:
        link = self.config.link
        return Backoff(link.reconnect_initial_backoff_s, link.reconnect_max_backoff_s, deadline_s=deadline_s)

    def _watch_replicas(self, zsession: zenoh.Session) -> zenoh.Subscriber[None]:
        """Liveliness of every replica this edge may use: a new token ends a reconnect backoff."""
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

    async def _open_zenoh(self) -> zenoh.Session:
        # A Zenoh client's open() fails at once while nothing listens (ZENOH_FACTS §1).
        settings = self.config.zenoh_settings()
        backoff = self._backoff(deadline_s=self.config.link.connect_timeout_s)
        while True:
            try:
                return await self.resources.enter_async_context(open_session(settings))
            except zenoh.ZError as exc:
                problem = str(exc)
            if not await backoff.wait():
                raise EdgeStartError(
                    f"cannot reach a servo server at {', '.join(self.config.link.connect)} ({problem}); "
                    "is servo-serve running there?",
                    refused=False,
                )

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
            except (NoServerFound, RequestTimeout) as exc:
                problem = str(exc)
            if not await backoff.wait():
                raise EdgeStartError(
                    f"no usable servo server within {self.config.link.connect_timeout_s:g} s: {problem}",
                    refused=False,
                )

    async def _open(self, client: PolicyClient) -> None:
        cfg = self.config
        self._epoch += 1
        session = await client.connect_best(
            features=self.features,
            fps=self.spec.fps,
            app=cfg.server.app or None,
            model=cfg.server.model or None,
            accept=self._acceptable,
            task=cfg.task,
            rtc=cfg.pipeline.rtc,
            epoch=self._epoch,
            tags=dict(cfg.tags),
            timeout=min(2.0, cfg.failsafe.request_timeout_s),
            previous=self._previous,
        )
        self._previous = session
        assert session.ack is not None
        ack = session.ack
        if not self._acceptable(session.server, ack.policy.revision):
            await session.close()  # the status said otherwise: a replica mid-upgrade
            raise SessionEnded(f"replica {session.server.keys.replica} serves revision {ack.policy.revision}")
        # The revision was checked above; anything else that differs breaks the robot's contract.
        if self._identity is not None and (differences := model_differences(self._identity, ack.policy)):
            await session.close()
            self.failsafe.fatal(f"server came back with a different model: {'; '.join(differences)}")
            raise SessionEnded("different model")
        self._identity = ack.policy
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
            log.warning(
                "server warning",
                session_id=session.session_id,
                client_id=self.client_id,
                warning=warning,
            )

    def _revision_may_change(self) -> bool:
        """Unpinned edges take another revision only at an episode boundary (seeds/001 §8)."""
        return not self.config.server.revision and self.episode_starting

    def _acceptable(self, server: ServerInfo, revision: str | None = None) -> bool:
        """Whether this edge may use ``server`` now: the replica and revision rules."""
        rules = self.config.server
        revision = server.status.policy.revision if revision is None else revision
        if rules.replica and server.keys.replica != rules.replica:
            return False
        if rules.revision:
            return revision == rules.revision
        return self._identity is None or self._revision_may_change() or revision == self._identity.revision

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
                    # (failover, drain, restart) or nothing, and only a chunk of this session is fresh.
                    await self.stream(lambda: session.lost_reason if session.lost.is_set() else None, at_once=True)
                except SessionEnded as exc:
                    self.failsafe.lost(str(exc))
                with anyio.CancelScope(shield=True):
                    await session.close()
                self.session = None
                backoff.reset()
            if self.failsafe.dead.is_set() or self.tearing_down:
                return  # the arm is parking: nothing may start a session now
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
            result = await session.receive(seq, timeout=self.config.failsafe.request_timeout_s)
        self._receive_scope = None
        if scope.cancel_called:
            return None
        return Produced(result.chunk_model, result.chunk_robot, session.session_id, seq, result.inference_ms)

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
            codec=None if self.session is None else self.session.codec_status(),
            replica="" if self.session is None else self.session.server.keys.replica,
            model="" if self.session is None else self.session.server.keys.model,
        )


def _undeclare(watcher: zenoh.Subscriber[None]) -> None:
    with contextlib.suppress(zenoh.ZError):
        watcher.undeclare()


#: What every replica an edge uses must share with the first one: a difference is DEAD. The revision
#: has its own rules (`RemoteEngine._acceptable`: pinned, or changed at an episode boundary only).
SAME_MODEL_FIELDS = ("model", "chunk_size", "features")


def model_differences(was: PolicyInfo, now: PolicyInfo) -> list[str]:
    """Every field of `SAME_MODEL_FIELDS` that differs, as ``field now (was …)``; empty when the same."""
    differences = []
    for name in SAME_MODEL_FIELDS:
        old, new = getattr(was, name), getattr(now, name)
        if name == "features":
            differences += [
                f"features.{field} {getattr(new, field)!r} (was {getattr(old, field)!r})"
                for field in old.__struct_fields__
                if getattr(old, field) != getattr(new, field)
            ]
        elif old != new:
            differences.append(f"{name} {new!r} (was {old!r})")
    return differences
