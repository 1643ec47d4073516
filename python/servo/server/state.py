"""What the policy server's parts share: lifecycle, the replica served, sessions, metrics.

`PolicyServer` owns one `ServerState` and hands it to its `ControlPlane` and `InferenceWorker`:
they read and change the shared state through it instead of calling back into the server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import anyio
import zenoh
from anyio.abc import TaskGroup

from servo._core import MSG_DRAIN, ServerIdentity
from servo.logs import get_logger
from servo.server.admission import ReturningRobots
from servo.server.audit import RecentRequests
from servo.server.metrics import ServerMetrics
from servo.server.sessions import Session, SessionRegistry
from servo.wire import (
    SUPPORTED_SCHEMA_VERSIONS,
    DrainNotice,
    PolicyInfo,
    ServerKeys,
    StatusReply,
    WireError,
    encode,
)

log = get_logger(__name__)

Lifecycle = Literal["starting", "serving", "draining"]


@dataclass(frozen=True)
class Replica:
    """What this replica serves, fixed once the policy is loaded.

    ``max_sessions`` is decided once, with the serving mode in ``info``: 1 in exclusive mode
    (asked for, or forced by a chunk-stateful policy), the manifest's ``max_sessions`` otherwise.
    ``identity`` signs every session ack (`servo.identity`).
    """

    server_id: str
    keys: ServerKeys
    info: PolicyInfo
    max_sessions: int
    identity: ServerIdentity

    @property
    def exclusive(self) -> bool:
        """One session at a time; the policy itself is reset at every episode boundary."""
        return self.info.serving_mode == "exclusive"


class ServerState:
    """The state shared by `PolicyServer`, its `ControlPlane` and its `InferenceWorker`.

    The event loop owns the lifecycle, the replica binding and the opening and collection of
    sessions; the inference worker thread only reads `replica` and `load`. ``registry``,
    ``metrics`` and ``returning`` (robot keys that streamed here) are thread-safe on their own.

    ::

        starting ──bind(replica)──► starting, bound ──start_serving()──► serving
            │                             │                                │
            └───────────── drain() ───────┴────────────────────────────────┴──► draining (final)

    Control queries are answered from ``bind`` on (status says not warmed up, opens are refused
    until ``serving``).

    Args:
        client_grace_s: How long a session whose client's liveliness token is gone (or never
            appeared) is kept before it is collected.
        idle_session_s: A session without an authenticated observation for this long is collected
            (``idle``), whether or not its client's token is there and whatever else it sends: a
            squatter that declares a token and resets but never streams holds no slot for good.
        robot_labels: Most robots with metrics series of their own (`ServerMetrics`).
    """

    def __init__(self, *, client_grace_s: float, idle_session_s: float = 60.0, robot_labels: int = 256) -> None:
        self.registry = SessionRegistry()
        self.metrics = ServerMetrics(robot_labels)
        #: The last requests of each client, for the audit queryable (the audit log writes them).
        self.recent = RecentRequests()
        self.returning = ReturningRobots()
        self.lifecycle: Lifecycle = "starting"
        self._grace_s = client_grace_s
        self._idle_s = idle_session_s
        self._draining = anyio.Event()
        self._replica: Replica | None = None
        self._tg: TaskGroup | None = None
        self._changed = anyio.Event()

    # ------------------------------------------------------------------ lifecycle
    @property
    def replica(self) -> Replica:
        """What this replica serves (after `bind`)."""
        if self._replica is None:
            raise RuntimeError("the server state is not bound to a replica yet")
        return self._replica

    def bind(self, replica: Replica, task_group: TaskGroup) -> None:
        """The policy is loaded: fix what is served; grace timers run in ``task_group``."""
        self._replica, self._tg = replica, task_group
        self.metrics.max_sessions.set(replica.max_sessions)
        self.metrics.chunk_duration_ms.set(replica.info.chunk_size / replica.info.fps * 1e3)
        task_group.start_soon(self._evict_idle)

    def start_serving(self) -> None:
        """Warmed and declared: accept sessions (unless a drain came first)."""
        self.metrics.warmed_up.set(1)
        if self.lifecycle == "starting":
            self.lifecycle = "serving"

    def drain(self) -> bool:
        """Refuse new sessions from now on; False if already draining."""
        first = self.lifecycle != "draining"
        self.lifecycle = "draining"
        self._draining.set()
        self.metrics.draining.set(1)
        return first

    def health(self) -> tuple[bool, str]:
        """Whether the server serves, and its lifecycle state (for ``/healthz``)."""
        return self.lifecycle == "serving", self.lifecycle

    @property
    def load(self) -> float:
        """Robots' open sessions over their capacity (any thread); frontends' sessions apart."""
        return self.registry.robots() / self.replica.max_sessions

    def status(self, nonce: bytes) -> StatusReply:
        """Capabilities, load and identity of this replica; ``nonce`` is what a session open must carry now."""
        replica = self.replica
        keys = replica.keys
        return StatusReply(
            server_id=replica.server_id,
            app=keys.app,
            model_key=keys.model,
            replica=keys.replica,
            schema_versions=list(SUPPORTED_SCHEMA_VERSIONS),
            policy=replica.info,
            warmed_up=self.lifecycle != "starting",
            draining=self.lifecycle == "draining",
            active_sessions=self.registry.robots(),
            max_sessions=replica.max_sessions,
            load=self.load,
            identity=replica.identity.public_key,
            queue_wait_ms=self.metrics.queue_wait_ms.recent_median(),
            inference_ms=self.metrics.inference_ms.recent_median(),
            nonce=nonce,
        )

    # ------------------------------------------------------------------ sessions (event loop)
    def register(self, session: Session) -> None:
        """Add an opened session, replacing the client's previous one.

        The control plane decided it may (see `servo.server.auth.takeover`).
        A client whose liveliness token never shows up is collected like one that vanished.
        """
        replaced = self.registry.add(session)
        if replaced is not None:
            replaced.close_publisher()
            self.metrics.sessions_collected.labels("replaced").inc()
            log.info("session replaced", session_id=replaced.session_id, client_id=replaced.client_id)
        self.metrics.sessions_opened.inc()
        self.metrics.active_sessions.set(len(self.registry))
        self.metrics.robots.attach(session.client_id)
        self._sessions_changed()
        self._collect_later(session.session_id, opened=True)

    def collect(self, session: Session, reason: str) -> None:
        """Close a session (closed by its client, vanished, replaced, idle, shutdown); idempotent.

        Unless its client closed it (or the drain told it already), the client is told, encrypted: it
        re-opens at once instead of waiting out a request the server will never answer.
        """
        if self.registry.remove(session.session_id) is None:
            return
        if reason not in ("closed", "shutdown"):
            session.publish(MSG_DRAIN, encode(DrainNotice(f"the server closed this session: {reason}")))
        session.close_publisher()
        self._sessions_changed()
        if self.registry.by_client(session.client_id) is None:
            self.metrics.robots.detach(session.client_id)
        self.metrics.sessions_collected.labels(reason).inc()
        self.metrics.active_sessions.set(len(self.registry))
        log.info(
            "session closed",
            session_id=session.session_id,
            client_id=session.client_id,
            reason=reason,
        )

    def on_client_liveliness(self, sample: zenoh.Sample) -> None:
        """A client's liveliness token appeared or vanished (on the event loop)."""
        try:
            client_id = self.replica.keys.client_of(str(sample.key_expr))
        except WireError:
            return
        alive = sample.kind == zenoh.SampleKind.PUT
        session = self.registry.set_alive(client_id, alive)
        if session is not None and not alive:
            log.info("client vanished", session_id=session.session_id, client_id=client_id)
            self._collect_later(session.session_id)

    async def wait_sessions(self, predicate: Callable[[list[Session]], bool]) -> list[Session]:
        """Wait until ``predicate(sessions)`` holds; re-checked whenever a session opens or closes."""
        while not predicate(sessions := self.registry.snapshot()):
            await self._changed.wait()
        return sessions

    def _sessions_changed(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _collect_later(self, session_id: str, *, opened: bool = False) -> None:
        assert self._tg is not None, "bind() first"
        self._tg.start_soon(self._collect_if_gone, session_id, opened)

    async def _evict_idle(self) -> None:
        # A quarter of the bound between sweeps: a session lives at most 1.25 x idle_session_s idle.
        # Ends with the drain, which collects every session anyway.
        while self.lifecycle != "draining":
            with anyio.move_on_after(self._idle_s / 4):
                await self._draining.wait()
                return
            cutoff = time.monotonic_ns() - int(self._idle_s * 1e9)
            for session in self.registry.snapshot():
                if session.auth.last_observation_ns < cutoff:
                    log.info("session idle", session_id=session.session_id, client_id=session.client_id)
                    self.collect(session, "idle")

    async def _collect_if_gone(self, session_id: str, opened: bool) -> None:
        """After the grace, collect the session if its client's token is not there.

        The timer started at the open is for a token that never came: one that came and went
        since (``token_lost``) started its own timer, so the client gets its whole grace from then.
        """
        await anyio.sleep(self._grace_s)
        session = self.registry.get(session_id)
        if session is None or (opened and session.token_lost):
            return
        if not self.registry.client_alive(session.client_id):
            self.collect(session, "vanished")
