"""The policy server: one model on one device, serving many robots over Zenoh.

Threads: the event loop owns Zenoh declarations, control-plane handlers, liveliness and the
ops endpoint; zenoh-python's callback threads (never Zenoh's network thread: `servo.server.lanes`)
deposit queries and liveliness events onto the loop; the data plane is three stages of one thread
each (see `servo.server.worker`): the observation intake authenticates, decodes and deposits
(`servo.server.intake`, on the lanes of `servo.server.lanes`), the inference
worker thread runs forwards (in the policy process by default: `servo.server.policy_process`),
and a reply thread publishes chunks in order while the worker already runs the next forward.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import zenoh
from anyio.abc import TaskGroup, TaskStatus
from zenoh.handlers import Callback

from servo._core import MSG_DRAIN
from servo.identity import Identity
from servo.logs import get_logger
from servo.policy import Policy, PolicySpec
from servo.policy.compatibility import describe
from servo.policy.frames import is_cuda
from servo.policy.runner import Forwards
from servo.server.audit import AuditLog
from servo.server.control import ControlPlane
from servo.server.decoding import ObservationDecoder, device_frames_for
from servo.server.enrolment import Doors, enrolled_robots, open_doors, replica_identity
from servo.server.frontend import Frontend
from servo.server.intake import ObservationIntake
from servo.server.lanes import IntakeLanes, auto_lanes
from servo.server.manifest import Manifest
from servo.server.notices import KeylessNotices
from servo.server.ops import OpsEndpoint
from servo.server.policy_process import PolicyProcess, forwards_for
from servo.server.robots import RobotGate
from servo.server.scheduler import Scheduler, scheduler_for
from servo.server.sessions import Session
from servo.server.state import Replica, ServerState
from servo.server.trajectories import TrajectoryLibrary
from servo.server.worker import InferenceWorker
from servo.stages import LoopBridge
from servo.transport import Declared, open_zsession
from servo.wire import DrainNotice, PolicyInfo, ServerKeys, encode, fingerprint, slugify
from servo.wire.keys import host_server_id

log = get_logger(__name__)

#: How long a drain waits for the request in flight before giving up on it.
DRAIN_TIMEOUT_S = 30.0
#: How long drain notices travel alone before the server's liveliness token is withdrawn.
DRAIN_NOTICE_HEAD_START_S = 0.2


@dataclass(frozen=True)
class ServerReady:
    """Handed to ``task_status.started``: where the server is and what it serves.

    ``frontends`` maps each frontend's name to where it listens (``{"openpi": "ws://…"}``).
    """

    keys: ServerKeys
    info: PolicyInfo
    health_port: int | None
    #: The identity's fingerprint (``ed25519:…``): what edges pin in ``trusted_servers``.
    fingerprint: str
    frontends: dict[str, str] = field(default_factory=dict)
    #: Each warm-up request's duration (s).
    warmup_s: list[float] = field(default_factory=list)
    #: Each request timed after the warm-up (``model.plan_forwards``, s): the capacity plan's
    #: forward time (`servo.deploy.capacity`).
    forward_s: list[float] = field(default_factory=list)
    #: The data-plane paths in use: ``device``, ``frames`` (host, or device: nvJPEG on CUDA),
    #: ``pinned`` (host frames copied through pinned buffers), ``dtype``, ``cuda_graphs``,
    #: ``intake_threads`` (the observation lanes, `servo.server.lanes`), ``process`` (separate:
    #: the policy in its own process, or inline).
    paths: dict[str, str] = field(default_factory=dict)
    #: The policy process's pid (None: the policy runs in this process).
    policy_pid: int | None = None
    #: Robots enrolled (`servo.server.robots`).
    enrolled: int = 0
    #: Whether only enrolled robots may open sessions (`servo.server.enrolment.open_doors`).
    closed: bool = False
    #: The join token made at start for the robot's command (`servo.join`); empty when none.
    join_token: str = ""


class PolicyServer:
    """Loads, warms and serves one policy until `drain` is called or the task is cancelled.

    Owned by the event loop that runs `run`.

    Args:
        manifest: The validated manifest.
        policy: An already-built policy (tests, embedding); loaded from the manifest otherwise.
        scheduler: Session scheduling (default: batches of up to ``serving.max_batch`` for a
            chunk-stateless `BatchingPolicy` served shared, round-robin otherwise).
        frontends: Other protocols served alongside Zenoh (see `Frontend`).
        search_path: A directory a ``package.module:factory`` policy may be imported from (the
            manifest's own directory when started by ``servo-serve``).
        identity: The replica's identity, already loaded (``servo-serve --ray`` gives every replica
            the driver's); from ``[security]`` otherwise (`servo.server.enrolment`).
    """

    def __init__(
        self,
        manifest: Manifest,
        *,
        policy: Policy | None = None,
        scheduler: Scheduler | None = None,
        frontends: Sequence[Frontend] = (),
        search_path: str | Path | None = None,
        identity: Identity | None = None,
    ) -> None:
        self._identity = identity
        self.manifest = manifest
        self._frontends = tuple(frontends)
        self._policy = policy
        self._search_path = search_path
        self._hurry = threading.Event()
        self._scheduler = scheduler
        self.server_id = host_server_id(os.getpid())
        self.state = ServerState(
            client_grace_s=manifest.serving.client_grace_s,
            idle_session_s=manifest.limits.idle_session_s,
            robot_labels=manifest.ops.robot_metrics,
        )
        self.metrics = self.state.metrics
        self.registry = self.state.registry
        self._stop = anyio.Event()
        self._zsession: zenoh.Session | None = None
        self._warmup_s: list[float] = []
        self._forward_s: list[float] = []
        self._trajectories = TrajectoryLibrary({})
        self._worker: InferenceWorker | None = None

    async def wait_sessions(self, predicate: Callable[[list[Session]], bool]) -> list[Session]:
        """Wait until ``predicate(sessions)`` holds.

        Re-checked whenever a session opens or closes. Call from the event loop that runs the
        server (tests and embedding applications use it to wait for collection).
        """
        return await self.state.wait_sessions(predicate)

    @property
    def worker_turns(self) -> int | None:
        """Turns of the inference worker's loop once it serves (a health signal), None before."""
        return None if self._worker is None else self._worker.turns

    # ------------------------------------------------------------------ lifecycle
    def hurry(self) -> None:
        """Drain without waiting for the request in flight (a second interrupt)."""
        self._hurry.set()
        self.drain()

    def drain(self) -> None:
        """Begin a graceful shutdown.

        Refuses new sessions, finishes the request in flight, tells clients, exits `run`. Safe
        to call more than once, from the event loop.
        """
        if self.state.drain():
            log.info("drain requested", sessions=len(self.registry))
        self._stop.set()

    async def run(self, *, task_status: TaskStatus[ServerReady] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until drained or cancelled; ``task_status.started`` fires once warmed and declared."""
        m = self.manifest
        async with anyio.create_task_group() as tg:
            health_port = None
            if m.ops.health_port or m.ops.health_host:
                ops = OpsEndpoint(self.state.health, self.metrics.render)
                if m.ops.health_port:
                    health_port = await tg.start(ops.run, m.ops.health_host, m.ops.health_port)
            identity = self._identity
            if identity is None:
                identity = await anyio.to_thread.run_sync(replica_identity, m.security, m.serving.app)
            enrolled = await anyio.to_thread.run_sync(enrolled_robots, m.security)
            doors = await anyio.to_thread.run_sync(open_doors, m, identity, enrolled)
            # Listening while the policy loads: an edge that lost this server links again meanwhile,
            # and re-handshakes the moment the liveliness token appears (nothing is declared before).
            async with (
                open_zsession(m.zenoh) as zsession,
                forwards_for(self.manifest.model, self._policy, self._search_path) as forwards,
            ):
                # Read once here: the control plane answers from memory, never from disk on the loop.
                self._trajectories = await anyio.to_thread.run_sync(TrajectoryLibrary.load, m.trajectories)
                model = m.model
                replica = self._replica(forwards.spec, identity)
                scheduler = self._scheduler or scheduler_for(
                    forwards.spec,
                    batching=forwards.batching,
                    exclusive=replica.exclusive,
                    max_batch=m.serving.max_batch,
                    linger_ms=m.serving.batch_linger_ms,
                )
                # Every batch size the scheduler can form is warmed, not only a forward of one.
                sizes = range(1, min(scheduler.max_batch, replica.max_sessions) + 1)
                started = time.perf_counter()
                self._warmup_s = await anyio.to_thread.run_sync(forwards.warmup, model.warmup, sizes)
                if model.warmup:
                    self._forward_s = await anyio.to_thread.run_sync(forwards.timed_forwards, model.plan_forwards)
                log.info(
                    "policy warmed up",
                    warmup=model.warmup,
                    batch_sizes=len(sizes),
                    seconds=round(time.perf_counter() - started, 3),
                )
                self.state.bind(replica, tg)
                tg.start_soon(doors.joins.watch, self.state)
                audit = AuditLog(m.ops.audit_log, self.state.recent)
                try:
                    # Frontends end before the Zenoh session their sessions live on.
                    async with anyio.create_task_group() as frontends:
                        self._zsession = zsession
                        robots = RobotGate(doors.access, doors.joins, m.limits, self.state.returning)
                        await self._serve(
                            zsession, forwards, scheduler, audit, task_status, health_port, frontends, robots, doors
                        )
                finally:
                    audit.close()
                    tg.cancel_scope.cancel()

    async def _serve(
        self,
        zsession: zenoh.Session,
        runner: Forwards,
        scheduler: Scheduler,
        audit: AuditLog,
        task_status: TaskStatus[ServerReady],
        health_port: int | None,
        frontends: TaskGroup,
        robots: RobotGate,
        doors: Doors,
    ) -> None:
        m, state = self.manifest, self.state
        keys, info = state.replica.keys, state.replica.info
        bridge = LoopBridge()
        self._worker = worker = InferenceWorker(runner, state, scheduler, audit)
        # Frames decoded onto the device only beside the policy; never in a server without torch.
        policy_pid = runner.pid if isinstance(runner, PolicyProcess) else None
        device_frames = (
            None if policy_pid is not None else device_frames_for(m.model.frames, m.model.device, runner.spec)
        )
        lanes = m.serving.intake_threads or auto_lanes()
        decoder = ObservationDecoder(
            runner.spec,
            max_observation_bytes=m.serving.max_observation_bytes,
            pin_task=info.pin_task,
            device_frames=device_frames,
            callers=lanes,
        )
        paths = {
            "device": m.model.device,
            "frames": "host" if device_frames is None else "device",
            "pinned": "on" if is_cuda(m.model.device) and runner.spec.device_frames else "off",
            "process": "inline" if policy_pid is None else "separate",
            "dtype": m.model.dtype,
            "cuda_graphs": "on" if m.model.cuda_graphs else "off",
            "intake_threads": str(lanes),
        }
        notices = KeylessNotices(zsession, keys, state.replica.identity, self.metrics)
        intake = IntakeLanes(ObservationIntake(state, m, decoder, notices).on_sample, lanes)
        declared: list[Declared] = []
        token: zenoh.LivelinessToken | None = None
        try:
            control = ControlPlane(
                state,
                policy=runner,
                zsession=zsession,
                trajectories=self._trajectories,
                robots=robots,
                takeover_idle_s=m.security.takeover_idle_s,
                limits=m.limits,
                max_observation_bytes=m.serving.max_observation_bytes,
            )
            # zenoh-python's thread, never Zenoh's network thread (servo.server.lanes says why).
            on_client_alive: Callback[zenoh.Sample] = Callback(lambda s: bridge.call(state.on_client_liveliness, s))
            declared += [
                zsession.declare_subscriber(keys.all_obs, intake.callback()),  # servo.server.lanes
                *control.declare(bridge),
                zsession.liveliness().declare_subscriber(keys.all_client_alive, on_client_alive, history=True),
            ]
            worker.start()
            token = zsession.liveliness().declare_token(keys.alive)
            state.start_serving()
            identity = fingerprint(state.replica.identity.public_key)
            log.info(
                "serving",
                key=keys.prefix,
                model=info.model,
                listen=m.zenoh.listen_endpoints(),
                connect=m.zenoh.connect,
                mode=info.serving_mode,
                max_sessions=state.replica.max_sessions,
                scheduler=type(scheduler).__name__,
                identity=identity,
                enrolled=len(robots.enrolled),
                closed=doors.closed,
                **paths,
                policy_pid=policy_pid,
            )
            if not doors.closed:
                log.warning("any robot may connect: none is required to be enrolled")
            own = state.replica.identity
            endpoints = {
                f.name: await frontends.start(f.run, zsession, keys, state.health, own, doors.access)
                for f in self._frontends
            }
            ready = ServerReady(
                keys,
                info,
                health_port,
                identity,
                endpoints,
                warmup_s=self._warmup_s,
                forward_s=self._forward_s,
                paths=paths,
                enrolled=len(robots.enrolled),
                closed=doors.closed,
                join_token="" if doors.join_token is None else str(doors.join_token),
                policy_pid=policy_pid,
            )
            task_status.started(ready)
            await self._stop.wait()
        finally:
            with anyio.CancelScope(shield=True):
                state.drain()
                # Clients learn at once, even while a forward hangs: they fail over meanwhile.
                if self._notify_drain():
                    # Withdrawing the liveliness token is a declaration: it travels at control
                    # priority and may overtake the notices, and clients see it on another
                    # callback thread. Give the notices a head start so clients learn why.
                    await anyio.sleep(DRAIN_NOTICE_HEAD_START_S)
                # Their sessions have been told like a robot's; idle connections close now.
                frontends.cancel_scope.cancel()
                if token is not None:
                    token.undeclare()
                finished = await anyio.to_thread.run_sync(lambda: worker.stop(DRAIN_TIMEOUT_S, abandon=self._hurry))
                bridge.close()
                for entity in reversed(declared):
                    entity.undeclare()
                intake.close()
                decoder.close()
                for session in self.registry.snapshot():
                    state.collect(session, "shutdown")
                log.info("drained", in_flight_finished=finished)

    def _replica(self, spec: PolicySpec, identity: Identity) -> Replica:
        """What this replica serves; the one place the serving mode and capacity are decided."""
        serving = self.manifest.serving
        exclusive = serving.mode == "exclusive" or not spec.chunk_stateless
        if exclusive and serving.mode == "shared":
            log.warning(
                "policy is chunk-stateful: serving in exclusive mode (one session, policy reset per episode)",
                model=spec.model,
            )
        info = describe(
            spec,
            serving_mode="exclusive" if exclusive else "shared",
            revision=self.manifest.model.revision,
            default_task=serving.default_task,
            pin_task=serving.pin_task,
            strict_fps=serving.strict_fps,
        )
        keys = ServerKeys(serving.app, slugify(spec.model, what="model"), serving.replica or self.server_id)
        return Replica(
            self.server_id, keys, info, max_sessions=1 if exclusive else serving.max_sessions, identity=identity
        )

    def _notify_drain(self) -> bool:
        """Tell every session's client the server is going away; False if there was nobody."""
        notice = encode(DrainNotice("server draining"))
        sessions = self.registry.snapshot()
        for session in sessions:
            session.publish(MSG_DRAIN, notice)
        return bool(sessions)
