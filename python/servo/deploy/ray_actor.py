"""The Ray side of `servo.deploy.ray`: the options every actor gets and the actor that hosts a replica.

Runs in each replica's Ray worker process; the driver (`servo.deploy.ray`) creates the actors.

**Planned stops are reported as planned.** A replica that ends its process on purpose (a rolling
restart, SIGTERM to its process, its node draining) so that Ray restarts it first answers the
driver's pending `ReplicaActor.wait_stopped` with the reason (`ReplicaStopped.planned`) and
waits, a bounded time, for the driver to `acknowledge` it: the driver then says "restarting
(rolling restart)", not that the replica was lost, and no call of the driver is left running
on the process when it ends (Ray would report those as failed by an unexpected system error).
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Annotated, Literal

import msgspec
import ray

from servo.config import NonEmptyStr, NonNegativeSeconds, PositiveFloat, PositiveInt, Seconds, doc
from servo.deploy.host import ReplicaHost, ReplicaReady, encode_status
from servo.identity import Identity
from servo.logs import configure_logging, get_logger
from servo.server.manifest import Manifest
from servo.server.service import DRAIN_TIMEOUT_S

log = get_logger(__name__)

#: How often an actor asks whether its node is being drained (one small GCS call).
NODE_POLL_S = 1.0
#: Calls one actor serves at once: wait_ready, wait_stopped, sessions and drain from a driver, with room.
ACTOR_CONCURRENCY = 8
#: How long a replica ending its process on purpose waits for the driver to have its report (s).
REPORT_TIMEOUT_S = 5.0


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
    resettle_timeout_s: Annotated[
        NonNegativeSeconds,
        doc(
            "A rolling restart drains the next replica once edges hold their share of sessions on the restarted "
            "one, or after this long (s)."
        ),
    ] = 30.0


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
        identity_seed: The deployment's identity, loaded by the driver: replicas sign as one server.
    """

    def __init__(self, manifest: bytes, options: bytes, search_path: str | None, identity_seed: bytes) -> None:
        opts = msgspec.msgpack.decode(options, type=RayOptions)
        configure_logging(opts.log_level, json=opts.json_logs)
        self._drain_timeout = opts.drain_timeout_s
        replica = msgspec.msgpack.decode(manifest, type=Manifest)
        self._host = ReplicaHost(replica, search_path=search_path, identity=Identity.from_seed(identity_seed))
        self._asked = threading.Event()  # set by `drain`: the process outlives this stop
        #: Why the process ends on purpose ("" until it does): what `wait_stopped` reports.
        self._planned = ""
        self._watched = threading.Event()  # a driver waits in `wait_stopped`
        self._acknowledged = threading.Event()  # ... and has its report
        signal.signal(signal.SIGTERM, self._on_sigterm)
        node_id = ray.get_runtime_context().get_node_id()
        threading.Thread(target=self._watch, args=(node_id,), name="servo-watch", daemon=True).start()

    def wait_ready(self, replacing: int = 0) -> bytes:
        """The replica's `ReplicaReady` or `ReplicaFailed`, once known.

        With ``replacing`` (a pid), the readiness of the process that follows that one: a call
        reaching that process while it ends waits for the end, and Ray retries it on the next.
        """
        status = self._host.wait_ready()
        if replacing and isinstance(status, ReplicaReady) and status.pid == replacing:
            threading.Event().wait()  # never set: the process ends first
        return encode_status(status)

    def wait_stopped(self) -> bytes:
        """The replica's `ReplicaStopped`, once a drain asked through `drain` (or a failed start) ended it.

        Any other stop ends the process before this returns: the call fails with the actor's
        death, which is what the caller must learn (Ray restarts the actor).
        """
        self._watched.set()
        stopped = self._host.wait_stopped()
        if self._planned:  # set before the drain began
            return encode_status(msgspec.structs.replace(stopped, restarting=True, planned=self._planned))
        if not self._asked.is_set() and isinstance(self._host.wait_ready(), ReplicaReady):
            threading.Event().wait()  # never set: the process ends first
        return encode_status(stopped)

    def acknowledge(self) -> None:
        """The driver has this replica's planned-stop report: its process may end now."""
        self._acknowledged.set()

    def sessions(self) -> int:
        """Sessions the replica's server holds now (0 while it starts)."""
        return self._host.sessions()

    def drain(self) -> bytes:
        """Drain the replica and keep the process; its `ReplicaStopped`."""
        self._asked.set()
        return encode_status(self._host.drain(self._drain_timeout))

    def restart(self) -> None:
        """Drain the replica, then end the process so that Ray starts it again (a rolling restart).

        Returns at once; the drain and the end follow on a thread of their own (reported through
        `wait_stopped`), so this call is not running when the process ends.
        """
        threading.Thread(target=self._drain_and_exit, args=("rolling restart",), name="servo-restart").start()

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
            if self._planned:
                return  # a planned stop (SIGTERM, a rolling restart) ends the process itself
            if not self._asked.is_set() and isinstance(self._host.wait_ready(), ReplicaReady):
                self._drain_and_exit(f"server stopped: {stopped.error or 'drained'}", planned=False)
            return

    def _drain_and_exit(self, reason: str, *, planned: bool = True) -> None:
        if planned:
            self._planned = reason  # before the drain: `wait_stopped` and `_watch` read it once it ends
        log.info("ending the replica's process", replica=self._host.replica, reason=reason)
        self._host.drain(self._drain_timeout)
        if self._watched.is_set():  # a driver follows this replica: its report goes first
            self._acknowledged.wait(REPORT_TIMEOUT_S)
        os._exit(1)


def _node_draining(node_id: str) -> bool:
    # Ray offers no public call for this (Ray Serve's controller polls the same private one).
    try:
        return node_id in ray._private.state.state.get_draining_nodes()
    except Exception:  # a Ray without the call, or a GCS going away: not known to drain
        return False


ACTOR = ray.remote(ReplicaActor)
