"""Replicas of one policy server as Ray actors on an existing cluster (the ``ray`` extra).

::

    deployment = deploy(manifest, replicas=2, address="auto")   # connects, starts the actors
    ready = await deployment.wait_ready()                        # one ReplicaReady per replica
    ...
    await deployment.drain()                                      # drain notices, tokens withdrawn

**Placement**: one GPU per replica (``num_gpus=1``) when the manifest's device is CUDA, else
``num_cpus`` CPUs; replicas are spread over the nodes. Replica ids, ports and files per replica
come from `servo.deploy.plan`. Each actor runs a `ReplicaHost`; what it reports crosses Ray as
msgpack bytes.

**Failure**: Ray restarts a dead actor up to ``max_restarts`` times by re-running its constructor
with the same arguments, so the replica comes back with the same id, ports and a fresh liveliness
token; edges fail over meanwhile. A server that stops by itself ends its actor's process so that
Ray restarts it the same way.

**Draining**: `Deployment.drain` (``servo-serve`` does it on SIGTERM/Ctrl-C), which then ends
the actors. `Deployment.rolling_restart` (``servo-serve`` on SIGHUP) drains and restarts one
replica at a time, each serving again before the next drains. SIGTERM to an actor's process
drains the replica, then ends the process (Ray then restarts it: a drain-and-restart of one
replica). A node being drained (SIGTERM to ``ray start --block``
makes Ray drain its node) drains its replicas, which then exit so Ray can place them elsewhere.
``ray stop`` runs no code in the actor: it SIGTERMs the raylet, which unregisters the node and
sends SIGTERM then SIGKILL to every worker's process group in the same millisecond (Ray 2.60).
Edges still see the liveliness token vanish within milliseconds, when the kernel closes the dead
process's sockets, and fail over; stop the driver first for drain notices.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, Literal

import anyio
import msgspec
import ray
from anyio.streams.memory import MemoryObjectSendStream
from ray.actor import ActorHandle
from ray.exceptions import ActorAlreadyExistsError, ActorDiedError, RayActorError

from servo.config import NonEmptyStr, PositiveFloat, PositiveInt, Seconds, convert, doc
from servo.deploy import DeployError
from servo.deploy.host import (
    ReplicaFailed,
    ReplicaHost,
    ReplicaReady,
    ReplicaStatus,
    ReplicaStopped,
    decode_status,
    encode_status,
)
from servo.deploy.plan import replica_manifests
from servo.logs import configure_logging, get_logger
from servo.server.manifest import Manifest
from servo.server.service import DRAIN_TIMEOUT_S

log = get_logger(__name__)

#: How often an actor asks whether its node is being drained (one small GCS call).
NODE_POLL_S = 1.0
#: Calls one actor serves at once: wait_ready, wait_stopped and drain from a driver, with room.
_ACTOR_CONCURRENCY = 8


class RayOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How `deploy` places the replicas (``servo-serve --ray`` flags)."""

    address: Annotated[NonEmptyStr, doc("Ray cluster to join: 'auto' or the head's host:port.")] = "auto"
    replicas: Annotated[PositiveInt, doc("Number of servers to start.", le=1024)] = 1
    num_cpus: Annotated[PositiveFloat, doc("CPUs Ray reserves for each replica.")] = 1.0
    max_restarts: Annotated[int, doc("How often Ray restarts a dead replica; -1 restarts forever.", ge=-1)] = -1
    namespace: Annotated[NonEmptyStr, doc("Ray namespace of the replica actors.")] = "servo"
    drain_timeout_s: Annotated[Seconds, doc("How long a replica may take to drain before it is killed.")] = (
        DRAIN_TIMEOUT_S + 5.0
    )
    log_level: Annotated[Literal["debug", "info", "warning", "error"], doc("Log level of the replicas.")] = "info"
    json_logs: Annotated[bool, doc("Replicas log JSON lines instead of console text.")] = False


# ---------------------------------------------------------------------------- the actor
class ReplicaActor:
    """One replica: a `ReplicaHost` inside a Ray actor.

    Ray runs the constructor on the worker's main thread (again after a restart, with the same
    arguments) and the methods on a pool of threads. Only a drain asked through `drain` leaves
    the process running. A server that stops for any other reason ends the process the way a
    crash does, so that Ray restarts the actor: SIGTERM (drained first), its node draining
    (drained first; a daemon thread watches), or the server failing while it served.
    ``os._exit`` is the way out: Ray's own SIGTERM handler exits through the interpreter, which
    waits for every thread still serving a call.

    Args:
        manifest: The replica's `Manifest`, msgpack-encoded.
        options: The deployment's `RayOptions`, msgpack-encoded.
        search_path: A directory a ``package.module:factory`` policy may be imported from.
    """

    def __init__(self, manifest: bytes, options: bytes, search_path: str | None) -> None:
        opts = msgspec.msgpack.decode(options, type=RayOptions)
        configure_logging(opts.log_level, json=opts.json_logs)
        self._drain_timeout = opts.drain_timeout_s
        self._host = ReplicaHost(msgspec.msgpack.decode(manifest, type=Manifest), search_path=search_path)
        self._asked = threading.Event()  # set by `drain`: the process outlives this stop
        signal.signal(signal.SIGTERM, self._on_sigterm)
        node_id = ray.get_runtime_context().get_node_id()
        threading.Thread(target=self._watch, args=(node_id,), name="servo-watch", daemon=True).start()

    def wait_ready(self) -> bytes:
        """The replica's `ReplicaReady` or `ReplicaFailed`, once known."""
        return encode_status(self._host.wait_ready())

    def wait_stopped(self) -> bytes:
        """The replica's `ReplicaStopped`, once a drain asked through `drain` (or a failed start) ended it.

        Any other stop ends the process before this returns: the call fails with the actor's
        death, which is what the caller must learn (Ray restarts the actor).
        """
        stopped = self._host.wait_stopped()
        if not self._asked.is_set() and isinstance(self._host.wait_ready(), ReplicaReady):
            threading.Event().wait()  # never set: the process ends first
        return encode_status(stopped)

    def drain(self) -> bytes:
        """Drain the replica and keep the process; its `ReplicaStopped`."""
        self._asked.set()
        return encode_status(self._host.drain(self._drain_timeout))

    def restart(self) -> None:
        """Drain the replica, then end the process so that Ray starts it again (a rolling restart).

        The call never returns: the caller learns the end from the actor's death.
        """
        self._drain_and_exit("rolling restart")

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """Main thread: drain, then end the process (replacing Ray's handler, see the class)."""
        self._drain_and_exit("SIGTERM")

    def _watch(self, node_id: str) -> None:
        while True:
            try:
                stopped = self._host.wait_stopped(NODE_POLL_S)
            except TimeoutError:
                if _node_draining(node_id):
                    self._drain_and_exit("node draining")  # Ray restarts the replica on another node
                continue
            if not self._asked.is_set() and isinstance(self._host.wait_ready(), ReplicaReady):
                self._drain_and_exit(f"server stopped: {stopped.error or 'drained'}")
            return

    def _drain_and_exit(self, reason: str) -> None:
        log.info("ending the replica's process", replica=self._host.replica, reason=reason)
        self._host.drain(self._drain_timeout)
        os._exit(1)


def _node_draining(node_id: str) -> bool:
    # Ray offers no public call for this (Ray Serve's controller polls the same private one).
    try:
        return node_id in ray._private.state.state.get_draining_nodes()
    except Exception:  # a Ray without the call, or a GCS going away: not known to drain
        return False


# ---------------------------------------------------------------------------- the driver
@dataclass(frozen=True)
class Replica:
    """One replica actor, as seen by the driver that deployed it (owned by its event loop)."""

    index: int
    replica_id: str
    actor: ActorHandle[ReplicaActor]

    async def wait_ready(self) -> ReplicaReady | ReplicaFailed:
        """Wait until the replica serves, across restarts of its actor.

        `ReplicaFailed` when it cannot start or its actor is dead for good.
        """
        try:
            data = await self.actor.wait_ready.options(max_task_retries=-1).remote()
        except RayActorError as exc:
            return ReplicaFailed(self.replica_id, f"actor is dead: {_reason(exc)}")
        return _expect(decode_status(data), ReplicaReady, ReplicaFailed)

    async def wait_stopped(self) -> ReplicaStopped:
        """Wait until the replica's server stops or its actor dies (``restarting`` if Ray restarts it)."""
        try:
            data = await self.actor.wait_stopped.remote()
        except ActorDiedError as exc:
            return ReplicaStopped(self.replica_id, drained=False, error=f"actor is dead: {_reason(exc)}")
        except RayActorError as exc:
            return ReplicaStopped(self.replica_id, drained=False, error=_reason(exc), restarting=True)
        return _expect(decode_status(data), ReplicaStopped)


class Deployment:
    """The replica actors of one manifest. Owned by the thread (and event loop) that deployed them."""

    def __init__(self, replicas: list[Replica], options: RayOptions, *, owns_ray: bool) -> None:
        self.replicas = tuple(replicas)
        self.options = options
        self._owns_ray = owns_ray
        self._closed = False

    async def wait_ready(self) -> list[ReplicaReady]:
        """Wait until every replica serves.

        Raises:
            DeployError: a replica failed to start (the first failure's message).
        """
        statuses: list[ReplicaReady | ReplicaFailed] = []
        async with anyio.create_task_group() as tg:
            for replica in self.replicas:
                tg.start_soon(_append_ready, replica, statuses)
        failed = [s for s in statuses if isinstance(s, ReplicaFailed)]
        if failed:
            raise DeployError(f"replica {failed[0].replica}: {failed[0].error}")
        return sorted((s for s in statuses if isinstance(s, ReplicaReady)), key=lambda s: s.replica)

    async def watch(self, send: MemoryObjectSendStream[ReplicaStatus]) -> None:
        """Send every replica's readiness and stops as they happen; returns once all are gone for good.

        A replica is gone for good when it failed to start or stopped without Ray restarting it.
        """
        async with send, anyio.create_task_group() as tg:
            for replica in self.replicas:
                tg.start_soon(_follow, replica, send.clone())

    async def rolling_restart(self, say: Callable[[str], None] = lambda _: None) -> bool:
        """Drain and restart the replicas one at a time, each serving again before the next drains.

        Edges of the replica being restarted fail over to the others (its drain notice and token
        withdrawal come first); Ray re-runs the actor with the same manifest, so what changes is
        what the nodes hold: the installed code, a checkpoint replaced at the same path. False,
        with the reason said, when a replica does not come back (the rest are left untouched).
        """
        if self.options.max_restarts == 0:
            say("rolling restart refused: the replicas are not restarted by Ray (--ray-max-restarts 0)")
            return False
        for replica in self.replicas:
            say(f"rolling restart: draining replica {replica.replica_id}")
            with contextlib.suppress(RayActorError):
                await replica.actor.restart.remote()
            ready = await replica.wait_ready()
            if isinstance(ready, ReplicaFailed):
                say(f"rolling restart stopped: replica {replica.replica_id} failed: {ready.error}")
                return False
            say(f"rolling restart: replica {replica.replica_id} serves again (pid {ready.pid})")
        return True

    async def drain(self) -> list[ReplicaStopped]:
        """Drain every replica at once, then end their actors (no restart)."""
        refs: list[ray.ObjectRef[bytes]] = [replica.actor.drain.remote() for replica in self.replicas]
        results = []
        with anyio.move_on_after(self.options.drain_timeout_s + 5.0):
            for replica, ref in zip(self.replicas, refs, strict=True):
                try:
                    results.append(_expect(decode_status(await ref), ReplicaStopped))
                except RayActorError as exc:
                    results.append(ReplicaStopped(replica.replica_id, drained=False, error=_reason(exc)))
        self.close()
        return results

    def close(self) -> None:
        """End every replica actor at once (no drain, no restart); disconnect if `deploy` connected.

        Safe to call more than once: once disconnected, any Ray call would start a new local cluster.
        """
        if self._closed:
            return
        self._closed = True
        for replica in self.replicas:
            ray.kill(replica.actor, no_restart=True)
        if self._owns_ray:
            ray.shutdown()


def deploy(manifest: Manifest, *, manifest_path: str | Path | None = None, **options: Any) -> Deployment:
    """Start the replicas of ``manifest`` as Ray actors; returns once they are created.

    Connects to the cluster at ``options["address"]`` unless this process already called
    ``ray.init``. Call from the main thread: Ray installs its signal handlers there.

    Args:
        manifest: The validated manifest every replica derives its own from.
        manifest_path: The file it was read from: named in errors, and a ``package.module:factory``
            policy may be imported from its directory (as ``servo-serve`` allows).
        **options: `RayOptions` fields (``replicas=2``, ``address="auto"``, …).

    Raises:
        ConfigError: an option is invalid, or the manifest cannot be shared by that many
            replicas (the key named).
        DeployError: a replica of the same id already runs in the namespace.
        ConnectionError: no Ray cluster at the address.
    """
    opts = convert(options, RayOptions, origin="ray options")
    origin = str(manifest_path) if manifest_path is not None else "manifest"
    manifests = replica_manifests(manifest, opts.replicas, cwd=Path.cwd(), origin=origin)
    search_path = str(Path(manifest_path).resolve().parent) if manifest_path is not None else None
    owns_ray = not ray.is_initialized()
    if owns_ray:
        _connect(opts.address, opts.namespace)
    placement = actor_options(manifest, opts)
    encoded_options = msgspec.msgpack.encode(opts)
    replicas: list[Replica] = []
    try:
        for index, replica_manifest in enumerate(manifests):
            replica_id = replica_manifest.serving.replica
            actor = _ACTOR.options(name=f"{manifest.serving.app}/{replica_id}", **placement).remote(
                msgspec.msgpack.encode(replica_manifest), encoded_options, search_path
            )
            assert isinstance(actor, ActorHandle)
            replicas.append(Replica(index, replica_id, actor))
    except ActorAlreadyExistsError as exc:
        Deployment(replicas, opts, owns_ray=owns_ray).close()
        raise DeployError(
            f"replica {replica_id!r} of app {manifest.serving.app!r} already runs in Ray namespace "
            f"{opts.namespace!r} ({exc}); stop that deployment or set serving.replica"
        ) from None
    return Deployment(replicas, opts, owns_ray=owns_ray)


def actor_options(manifest: Manifest, options: RayOptions) -> dict[str, Any]:
    """Ray actor options of every replica: resources, restarts, namespace, spreading."""
    return {
        "namespace": options.namespace,
        "num_cpus": options.num_cpus,
        "num_gpus": 1 if manifest.model.device.startswith("cuda") else 0,
        "max_restarts": options.max_restarts,
        "max_concurrency": _ACTOR_CONCURRENCY,
        "scheduling_strategy": "SPREAD",
    }


_ACTOR = ray.remote(ReplicaActor)


def _connect(address: str, namespace: str) -> None:
    host, sep, port = address.rpartition(":")
    if sep and port.isdigit() and "://" not in address:
        # Ray retries an unreachable head for minutes; one connection attempt answers at once.
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
        except OSError as exc:
            raise ConnectionError(f"no Ray cluster at {address}: {exc.strerror or exc}") from None
    ray.init(address=address, namespace=namespace)


async def _append_ready(replica: Replica, statuses: list[ReplicaReady | ReplicaFailed]) -> None:
    statuses.append(await replica.wait_ready())


async def _follow(replica: Replica, send: MemoryObjectSendStream[ReplicaStatus]) -> None:
    async with send:
        while True:
            ready = await replica.wait_ready()
            await send.send(ready)
            if isinstance(ready, ReplicaFailed):
                return
            stopped = await replica.wait_stopped()
            await send.send(stopped)
            if not stopped.restarting:
                return


def _expect(status: ReplicaStatus, *kinds: type[Any]) -> Any:
    if not isinstance(status, kinds):
        raise DeployError(f"replica {status.replica} answered a {type(status).__name__}")
    return status


def _reason(exc: RayActorError) -> str:
    if not isinstance(exc, ActorDiedError):
        return "its process died"  # Ray's text for a restarting actor is about RPC sockets
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
