"""The policy server: one model on one device, serving many robots over Zenoh.

Threads: the event loop owns Zenoh declarations, control-plane handlers, liveliness and the
ops endpoint; Zenoh callback threads only deposit (observations into mailboxes, queries and
liveliness events onto the loop); the inference worker thread owns the policy, a decoder
thread decodes observations ahead of it and a reply thread publishes chunks while it already
runs the next forward (see `servo.server.worker`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import zenoh
from anyio.abc import TaskGroup, TaskStatus

from servo._core import (
    MSG_DRAIN,
    MSG_ERROR,
    MSG_OBS,
    Header,
    HeaderError,
    decode_header,
    unauthenticated,
)
from servo.logs import get_logger
from servo.policy import Policy, load_policy
from servo.policy.compatibility import describe
from servo.policy.runner import InferenceRunner
from servo.server.audit import AuditLog
from servo.server.control import ControlPlane, ServerState
from servo.server.manifest import Manifest
from servo.server.metrics import ServerMetrics
from servo.server.ops import OpsEndpoint
from servo.server.scheduler import RoundRobin, Scheduler
from servo.server.sessions import Pending, Rejected, Session, SessionRegistry
from servo.server.trajectories import TrajectoryLibrary
from servo.server.worker import InferenceWorker
from servo.transport import LoopBridge, open_session
from servo.wire import (
    DrainNotice,
    ErrorEvent,
    PolicyInfo,
    ServerKeys,
    WireError,
    encode,
    slugify,
)

log = get_logger(__name__)

#: How long a drain waits for the request in flight before giving up on it.
DRAIN_TIMEOUT_S = 30.0
#: How long drain notices travel alone before the server's liveliness token is withdrawn.
DRAIN_NOTICE_HEAD_START_S = 0.2


@dataclass(frozen=True)
class ServerReady:
    """Handed to ``task_status.started``: where the server is and what it serves."""

    keys: ServerKeys
    info: PolicyInfo
    health_port: int | None


class PolicyServer:
    """Loads, warms and serves one policy until `drain` is called or the task is cancelled.

    Owned by the event loop that runs `run`.

    Args:
        manifest: The validated manifest.
        policy: An already-built policy (tests, embedding); loaded from the manifest otherwise.
        scheduler: Session scheduling (round-robin by default).
        search_path: A directory a ``package.module:factory`` policy may be imported from (the
            manifest's own directory when started by ``servo-serve``).
    """

    def __init__(
        self,
        manifest: Manifest,
        *,
        policy: Policy | None = None,
        scheduler: Scheduler | None = None,
        search_path: str | Path | None = None,
    ) -> None:
        self.manifest = manifest
        self._search_path = search_path
        self._policy = policy
        self._scheduler = scheduler or RoundRobin()
        self.metrics = ServerMetrics()
        self.registry = SessionRegistry()
        self.server_id = f"{slugify(socket.gethostname())}-{os.getpid()}"
        self._state: ServerState = "starting"
        self._stop = anyio.Event()
        self._hurry = threading.Event()
        self._keys: ServerKeys | None = None
        self._info: PolicyInfo | None = None
        self._zsession: zenoh.Session | None = None
        self._tg: TaskGroup | None = None
        self._bridge: LoopBridge | None = None
        self._trajectories = TrajectoryLibrary(manifest.trajectories)
        self._changed = anyio.Event()
        self.metrics.max_sessions.set(self._max_sessions)

    async def wait_sessions(self, predicate: Callable[[list[Session]], bool]) -> list[Session]:
        """Wait until ``predicate(sessions)`` holds.

        Re-checked whenever a session opens or closes. Call from the event loop that runs the
        server (tests and embedding applications use it to wait for collection).
        """
        while not predicate(sessions := self.registry.snapshot()):
            await self._changed.wait()
        return sessions

    def _sessions_changed(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    # ------------------------------------------------------------------ lifecycle
    @property
    def _max_sessions(self) -> int:
        exclusive = self.manifest.serving.mode == "exclusive" or (
            self._policy is not None and not self._policy.spec.chunk_stateless
        )
        return 1 if exclusive else self.manifest.serving.max_sessions

    def hurry(self) -> None:
        """Drain without waiting for the request in flight (a second interrupt)."""
        self._hurry.set()
        self.drain()

    def drain(self) -> None:
        """Begin a graceful shutdown.

        Refuses new sessions, finishes the request in flight, tells clients, exits `run`. Safe
        to call more than once, from the event loop.
        """
        if self._state != "draining":
            log.info("drain requested", sessions=len(self.registry))
        self._state = "draining"
        self.metrics.draining.set(1)
        self._stop.set()

    async def run(self, *, task_status: TaskStatus[ServerReady] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until drained or cancelled; ``task_status.started`` fires once warmed and declared."""
        m = self.manifest
        async with anyio.create_task_group() as tg:
            self._tg = tg
            health_port = None
            if m.ops.health_port or m.ops.health_host:
                ops = OpsEndpoint(self._health, self.metrics.render)
                if m.ops.health_port:
                    health_port = await tg.start(ops.run, m.ops.health_host, m.ops.health_port)
            policy = await anyio.to_thread.run_sync(self._load_policy)
            runner = InferenceRunner(policy, device=m.model.device, dtype=m.model.dtype, compile=m.model.compile)
            started = time.perf_counter()
            await anyio.to_thread.run_sync(runner.warmup, m.model.warmup)
            log.info(
                "policy warmed up",
                warmup=m.model.warmup,
                seconds=round(time.perf_counter() - started, 3),
            )
            self._info = self._policy_info(policy)
            model_key = slugify(policy.spec.model, what="model")
            replica = m.serving.replica or self.server_id
            self._keys = ServerKeys(m.serving.app, model_key, replica)
            audit = AuditLog(m.ops.audit_log)
            try:
                async with open_session(m.zenoh) as zsession:
                    self._zsession = zsession
                    await self._serve(zsession, runner, audit, task_status, health_port)
            finally:
                audit.close()
                tg.cancel_scope.cancel()

    async def _serve(
        self,
        zsession: zenoh.Session,
        runner: InferenceRunner,
        audit: AuditLog,
        task_status: TaskStatus[ServerReady],
        health_port: int | None,
    ) -> None:
        m, keys, info = self.manifest, self._keys, self._info
        assert keys is not None
        assert info is not None
        self._bridge = bridge = LoopBridge()
        worker = InferenceWorker(
            runner,
            self.registry,
            self._scheduler,
            self.metrics,
            audit,
            exclusive=info.serving_mode == "exclusive",
            pin_task=info.pin_task,
            max_observation_bytes=m.serving.max_observation_bytes,
            load=self._load,
        )
        declared: list[zenoh.Subscriber[None] | zenoh.Queryable[None]] = []
        token: zenoh.LivelinessToken | None = None
        try:
            control = ControlPlane(
                server_id=self.server_id,
                keys=keys,
                info=info,
                policy=runner.policy,
                zsession=zsession,
                registry=self.registry,
                metrics=self.metrics,
                trajectories=self._trajectories,
                state=lambda: self._state,
                max_sessions=lambda: self._max_sessions,
                on_opened=self._watch_new_session,
                collect=self._collect,
            )
            declared += [
                zsession.declare_subscriber(keys.all_obs, self._on_observation),
                *control.declare(bridge),
                zsession.liveliness().declare_subscriber(
                    keys.all_client_alive,
                    lambda s: bridge.call(self._on_client_liveliness, s),
                    history=True,
                ),
            ]
            worker.start()
            token = zsession.liveliness().declare_token(keys.alive)
            self._state = "serving"
            self.metrics.warmed_up.set(1)
            log.info(
                "serving",
                key=keys.prefix,
                model=info.model,
                listen=m.zenoh.listen,
                connect=m.zenoh.connect,
                mode=info.serving_mode,
                max_sessions=self._max_sessions,
            )
            task_status.started(ServerReady(keys, info, health_port))
            await self._stop.wait()
        finally:
            with anyio.CancelScope(shield=True):
                self._state = "draining"
                self.metrics.draining.set(1)
                # Clients learn at once, even while a forward hangs: they fail over meanwhile.
                if self._notify_drain():
                    # Withdrawing the liveliness token is a declaration: it travels at control
                    # priority and may overtake the notices, and clients see it on another
                    # callback thread. Give the notices a head start so clients learn why.
                    await anyio.sleep(DRAIN_NOTICE_HEAD_START_S)
                if token is not None:
                    token.undeclare()
                finished = await anyio.to_thread.run_sync(lambda: worker.stop(DRAIN_TIMEOUT_S, abandon=self._hurry))
                bridge.closed = True
                for entity in reversed(declared):
                    entity.undeclare()  # type: ignore[no-untyped-call]  # union defeats untyped_calls_exclude
                for session in self.registry.snapshot():
                    self._collect(session, "shutdown")
                log.info("drained", in_flight_finished=finished)

    def _load_policy(self) -> Policy:
        model = self.manifest.model
        if self._policy is None:
            log.info("loading policy", source=model.source, device=model.device)
            self._policy = load_policy(model.source, model.options, device=model.device, search_path=self._search_path)
        self.metrics.max_sessions.set(self._max_sessions)
        return self._policy

    def _policy_info(self, policy: Policy) -> PolicyInfo:
        spec, serving = policy.spec, self.manifest.serving
        mode = serving.mode
        if not spec.chunk_stateless and mode == "shared":
            log.warning(
                "policy is chunk-stateful: serving in exclusive mode (one session, policy reset per episode)",
                model=spec.model,
            )
            mode = "exclusive"
        return describe(
            spec,
            serving_mode=mode,
            revision=self.manifest.model.revision,
            default_task=serving.default_task,
            pin_task=serving.pin_task,
            strict_fps=serving.strict_fps,
        )

    def _health(self) -> tuple[bool, str]:
        return self._state == "serving", self._state

    def _load(self) -> float:
        return len(self.registry) / self._max_sessions

    # ------------------------------------------------------------------ data plane
    def _on_observation(self, sample: zenoh.Sample) -> None:
        """Zenoh callback thread: route by key and header, deposit, return."""
        now = time.monotonic_ns()
        keys = self._keys
        assert keys is not None
        try:
            client_id = keys.client_of(str(sample.key_expr))
        except WireError:
            self.metrics.dropped.labels("bad_key").inc()
            return
        attachment = sample.attachment
        item: Pending | Rejected
        try:
            if attachment is None:
                raise HeaderError("observation has no attachment header")
            header = decode_header(attachment.to_bytes())
        except HeaderError as exc:
            item = Rejected(None, "bad_header", str(exc), now)
        else:
            size = len(sample.payload)
            if header.msg_type != MSG_OBS:
                item = Rejected(header, "bad_header", f"msg_type {header.msg_type} on an observation key", now)
            elif size > self.manifest.serving.max_observation_bytes:
                limit = self.manifest.serving.max_observation_bytes
                item = Rejected(
                    header,
                    "too_large",
                    f"observation of {size} bytes exceeds the limit of {limit}",
                    now,
                )
            else:
                item = Pending(header, sample.payload, now)  # copied out by the decoder thread
        outcome = self.registry.deposit(client_id, item)
        if outcome == "ok":
            return
        self.metrics.dropped.labels(outcome).inc()
        if outcome == "no_session" and item.header is not None:
            # Tell the client its session is gone (collected, or the server restarted) so it
            # re-opens one at once instead of waiting out its request timeout.
            self._tell_unknown_session(client_id, item.header)

    # ------------------------------------------------------------------ liveliness & collection
    def _watch_new_session(self, session: Session) -> None:
        self._sessions_changed()
        # A client whose liveliness token never shows up is collected like one that vanished.
        assert self._tg is not None
        self._tg.start_soon(self._collect_if_gone, session.session_id)

    def _on_client_liveliness(self, sample: zenoh.Sample) -> None:
        keys, tg = self._keys, self._tg
        assert keys is not None
        assert tg is not None
        try:
            client_id = keys.client_of(str(sample.key_expr))
        except WireError:
            return
        alive = sample.kind == zenoh.SampleKind.PUT
        session = self.registry.set_alive(client_id, alive)
        if session is not None and not alive:
            log.info("client vanished", session_id=session.session_id, client_id=client_id)
            tg.start_soon(self._collect_if_gone, session.session_id)

    async def _collect_if_gone(self, session_id: int) -> None:
        await anyio.sleep(self.manifest.serving.client_grace_s)
        session = self.registry.get(session_id)
        if session is not None and not session.alive:
            self._collect(session, "vanished")

    def _collect(self, session: Session, reason: str) -> None:
        if self.registry.remove(session.session_id) is None:
            return
        session.close_publisher()
        self._sessions_changed()
        self.metrics.sessions_collected.labels(reason).inc()
        self.metrics.active_sessions.set(len(self.registry))
        log.info(
            "session closed",
            session_id=session.session_id,
            client_id=session.client_id,
            reason=reason,
        )

    def _tell_unknown_session(self, client_id: str, header: Header) -> None:
        keys, zsession = self._keys, self._zsession
        assert keys is not None
        assert zsession is not None
        reply = Header(
            schema_version=header.schema_version,
            msg_type=MSG_ERROR,
            flags=0,
            seq_id=header.seq_id,
            episode_id=header.episode_id,
            session_epoch=header.session_epoch,
            client_mono_ns=header.client_mono_ns,
            session_id=header.session_id,
        )
        body = encode(ErrorEvent("unknown_session", f"no session for client {client_id!r}; open a new one"))
        with contextlib.suppress(zenoh.ZError):
            zsession.put(
                keys.client(client_id).action,
                body,
                attachment=unauthenticated(reply),
                congestion_control=zenoh.CongestionControl.DROP,
            )

    def _notify_drain(self) -> bool:
        """Tell every session's client the server is going away; False if there was nobody."""
        notice = encode(DrainNotice("server draining"))
        sessions = self.registry.snapshot()
        for session in sessions:
            header = Header(
                schema_version=session.schema_version,
                msg_type=MSG_DRAIN,
                flags=0,
                seq_id=0,
                episode_id=session.episode_id,
                session_epoch=session.epoch,
                client_mono_ns=0,
                session_id=session.session_id.to_bytes(16, "little"),
            )
            session.publish(notice, unauthenticated(header))
        return bool(sessions)
