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
replica at a time, each serving again, and holding its share of the sessions, before the next
drains (`Deployment.resettled`). Planned stops are reported as such (`servo.deploy.ray_actor`).
SIGTERM to an actor's process
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
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import msgspec
import ray
from anyio.streams.memory import MemoryObjectSendStream
from ray.actor import ActorHandle
from ray.exceptions import ActorAlreadyExistsError, ActorDiedError, RayActorError

from servo.config import convert
from servo.deploy import DeployError
from servo.deploy.host import ReplicaFailed, ReplicaReady, ReplicaStatus, ReplicaStopped, decode_status
from servo.deploy.plan import replica_manifests
from servo.deploy.ray_actor import ACTOR, ACTOR_CONCURRENCY, RayOptions, ReplicaActor
from servo.identity import IdentityError
from servo.logs import get_logger
from servo.server.enrolment import replica_identity
from servo.server.manifest import Manifest

__all__ = ["Deployment", "RayOptions", "Replica", "actor_options", "deploy"]

log = get_logger(__name__)

#: How often a rolling restart looks at the replicas' sessions while edges settle (s).
RESETTLE_POLL_S = 0.1


@dataclass(frozen=True)
class Replica:
    """One replica actor, as seen by the driver that deployed it (owned by its event loop)."""

    index: int
    replica_id: str
    actor: ActorHandle[ReplicaActor]

    async def wait_ready(self, replacing: int = 0) -> ReplicaReady | ReplicaFailed:
        """Wait until the replica serves, across restarts of its actor.

        With ``replacing`` (the pid of a process ending on purpose), until the process after it
        serves. `ReplicaFailed` when it cannot start or its actor is dead for good.
        """
        try:
            data = await self.actor.wait_ready.options(max_task_retries=-1).remote(replacing)
        except RayActorError as exc:
            return ReplicaFailed(self.replica_id, f"actor is dead: {_reason(exc)}")
        return _expect(decode_status(data), ReplicaReady, ReplicaFailed)

    async def wait_stopped(self) -> ReplicaStopped:
        """Wait until the replica's server stops or its actor dies (``restarting`` if Ray restarts it).

        A stop on purpose (``planned``) is acknowledged, which lets the replica's process end.
        """
        try:
            data = await self.actor.wait_stopped.remote()
        except ActorDiedError as exc:
            return ReplicaStopped(self.replica_id, drained=False, error=f"actor is dead: {_reason(exc)}")
        except RayActorError as exc:
            return ReplicaStopped(self.replica_id, drained=False, error=_reason(exc), restarting=True)
        stopped: ReplicaStopped = _expect(decode_status(data), ReplicaStopped)
        if stopped.planned:
            self.actor.acknowledge.remote()  # fire and forget: the process ends either way
        return stopped

    async def sessions(self) -> int:
        """Sessions the replica holds now (0 while it is down or starting)."""
        try:
            return int(await self.actor.sessions.remote())
        except RayActorError:
            return 0


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
            running = await replica.wait_ready()
            say(f"rolling restart: draining replica {replica.replica_id}")
            with contextlib.suppress(RayActorError):
                await replica.actor.restart.remote()
            ready = await replica.wait_ready(replacing=running.pid if isinstance(running, ReplicaReady) else 0)
            if isinstance(ready, ReplicaFailed):
                say(f"rolling restart stopped: replica {replica.replica_id} failed: {ready.error}")
                return False
            say(f"rolling restart: replica {replica.replica_id} serves again (pid {ready.pid})")
            if replica is not self.replicas[-1]:
                held, share = await self.resettled(replica)
                if held < share:
                    say(
                        f"rolling restart: replica {replica.replica_id} holds {held} of its {share} sessions after "
                        f"{self.options.resettle_timeout_s:g} s; draining the next one anyway"
                    )
                elif share:
                    say(f"rolling restart: replica {replica.replica_id} holds {held} sessions")
        return True

    async def resettled(self, replica: Replica) -> tuple[int, int]:
        """Wait until edges hold sessions on ``replica`` again, at most ``resettle_timeout_s``.

        Its share is what balanced placement gives it, ``sessions // replicas`` of every session
        the replicas hold: edges move to a replica that holds two or more fewer than theirs when
        its liveliness token appears. Draining the next replica before that would leave its
        edges with a replica they have not reached yet. Returns (sessions held, share).
        """
        deadline = time.monotonic() + self.options.resettle_timeout_s
        while True:
            counts = [await other.sessions() for other in self.replicas]
            held, share = counts[replica.index], sum(counts) // len(counts)
            if held >= share or time.monotonic() >= deadline:
                return held, share
            await anyio.sleep(RESETTLE_POLL_S)

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
    ``ray.init``. Call from the main thread: Ray installs its signal handlers there. The identity
    (``[security]``, on this machine) is loaded here and handed to every replica.

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
        IdentityError: the identity file cannot be read or created.
    """
    opts = convert(options, RayOptions, origin="ray options")
    origin = str(manifest_path) if manifest_path is not None else "manifest"
    manifests = replica_manifests(manifest, opts.replicas, cwd=Path.cwd(), origin=origin)
    search_path = str(Path(manifest_path).resolve().parent) if manifest_path is not None else None
    owns_ray = not ray.is_initialized()
    if owns_ray:
        _connect(opts.address, opts.namespace)
    try:
        seed = replica_identity(manifest.security, manifest.serving.app).seed
    except IdentityError:
        Deployment([], opts, owns_ray=owns_ray).close()  # leave Ray as it was found
        raise
    placement = actor_options(manifest, opts)
    encoded_options = msgspec.msgpack.encode(opts)
    replicas: list[Replica] = []
    try:
        for index, replica_manifest in enumerate(manifests):
            replica_id = replica_manifest.serving.replica
            actor = ACTOR.options(name=f"{manifest.serving.app}/{replica_id}", **placement).remote(
                msgspec.msgpack.encode(replica_manifest), encoded_options, search_path, seed
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
        "max_concurrency": ACTOR_CONCURRENCY,
        "scheduling_strategy": "SPREAD",
    }


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
        replacing = 0
        while True:
            ready = await replica.wait_ready(replacing)
            await send.send(ready)
            if isinstance(ready, ReplicaFailed):
                return
            stopped = await replica.wait_stopped()
            await send.send(stopped)
            if not stopped.restarting:
                return
            # A planned stop is reported while its process still runs: wait for the next one.
            replacing = ready.pid if stopped.planned else 0


def _expect(status: ReplicaStatus, *kinds: type[Any]) -> Any:
    if not isinstance(status, kinds):
        raise DeployError(f"replica {status.replica} answered a {type(status).__name__}")
    return status


def _reason(exc: RayActorError) -> str:
    if not isinstance(exc, ActorDiedError):
        return "its process died"  # Ray's text for a restarting actor is about RPC sockets
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
