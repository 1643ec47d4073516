"""One policy server on an event loop of its own, driven from other threads.

A cluster engine's worker process (a Ray actor) answers its engine's calls on threads the engine
owns; it cannot run servo's event loop there. `ReplicaHost` runs a `PolicyServer` beside them
and offers what a supervisor needs: wait until ready, wait until stopped, drain. What it reports
crosses the engine as typed msgpack bytes (`encode_status` / `decode_status`), never as Python objects.
"""

from __future__ import annotations

import os
import socket
import threading
from concurrent.futures import Future

import anyio
import msgspec
import zenoh

from servo.config import ConfigError
from servo.errors import first_error
from servo.identity import Identity
from servo.logs import get_logger
from servo.policy import Policy, PolicyLoadError
from servo.server.manifest import Manifest
from servo.server.service import PolicyServer, ServerReady
from servo.stages import LoopBridge

log = get_logger(__name__)


class ReplicaReady(msgspec.Struct, frozen=True, tag="ready"):
    """A replica is warmed, declared and serving."""

    replica: str
    key: str
    model: str
    revision: str
    pid: int
    host: str
    health_port: int | None


class ReplicaFailed(msgspec.Struct, frozen=True, tag="failed"):
    """A replica did not become ready; ``bad_config``: the manifest or the policy is at fault."""

    replica: str
    error: str
    bad_config: bool = False


class ReplicaStopped(msgspec.Struct, frozen=True, tag="stopped"):
    """A replica's server stopped: drained on request, or ended by ``error``.

    ``restarting`` is set by a supervisor that saw the process die while its engine restarts it;
    ``planned`` says why the process ended on purpose (a rolling restart, SIGTERM, its node
    draining), empty for a crash.
    """

    replica: str
    drained: bool
    error: str = ""
    restarting: bool = False
    planned: str = ""


ReplicaStatus = ReplicaReady | ReplicaFailed | ReplicaStopped


def encode_status(status: ReplicaStatus) -> bytes:
    """Bytes of a status, to cross a cluster engine."""
    return msgspec.msgpack.encode(status)


def decode_status(data: bytes) -> ReplicaStatus:
    """A status back from `encode_status`'s bytes (raises msgspec.DecodeError on anything else)."""
    status: ReplicaStatus = msgspec.msgpack.decode(data, type=ReplicaStatus)
    return status


class ReplicaHost:
    """Runs one `PolicyServer` until drained, on its own event loop in a daemon thread.

    Created by any thread; `wait_ready`, `wait_stopped` and `drain` block and may be called from
    any thread but the host's own, `drain_nowait` from any thread. States::

        starting ──ready──► serving ──drain or crash──► stopped
            └────────── failure or drain ─────────────────┘

    The thread is a daemon so that a drain overrunning its timeout cannot keep the process
    alive; the server closes its Zenoh session on every exit path (docs/design/zenoh.md §9).

    Args:
        manifest: The replica's manifest (``serving.replica`` set).
        policy: An already-built policy (tests); loaded from the manifest otherwise.
        search_path: A directory a ``package.module:factory`` policy may be imported from.
        identity: The deployment's identity, shared by its replicas; from the manifest otherwise.
    """

    def __init__(
        self,
        manifest: Manifest,
        *,
        policy: Policy | None = None,
        search_path: str | None = None,
        identity: Identity | None = None,
    ) -> None:
        self.replica = manifest.serving.replica
        self._manifest = manifest
        self._policy = policy
        self._search_path = search_path
        self._identity = identity
        self._ready: Future[ReplicaReady | ReplicaFailed] = Future()
        self._stopped: Future[ReplicaStopped] = Future()
        self._lock = threading.Lock()  # guards `_bridge` and `_drain_requested`, shared with callers
        self._bridge: LoopBridge | None = None
        self._drain_requested = False
        self._server: PolicyServer | None = None
        self._scope: anyio.CancelScope | None = None
        self._thread = threading.Thread(target=self._run, name=f"servo-{self.replica}", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float | None = None) -> ReplicaReady | ReplicaFailed:
        """Block until the server serves or failed to start.

        Raises:
            TimeoutError: neither within ``timeout`` seconds.
        """
        return self._ready.result(timeout)

    def wait_stopped(self, timeout: float | None = None) -> ReplicaStopped:
        """Block until the server stopped (drained, failed or crashed).

        Raises:
            TimeoutError: still running after ``timeout`` seconds.
        """
        return self._stopped.result(timeout)

    def sessions(self) -> int:
        """Sessions the server holds now (0 until it serves); any thread."""
        server = self._server
        return len(server.registry) if server is not None and self._ready.done() else 0

    def drain_nowait(self) -> None:
        """Ask the server to drain (or to abandon its start); returns at once. Idempotent.

        Draining withdraws the liveliness token, tells every session and closes the Zenoh
        session (`PolicyServer.drain`).
        """
        with self._lock:
            self._drain_requested = True
            bridge = self._bridge
        if bridge is not None:
            bridge.call(self._stop)

    def drain(self, timeout: float) -> ReplicaStopped:
        """`drain_nowait`, then wait up to ``timeout`` seconds for the server to stop."""
        self.drain_nowait()
        try:
            return self._stopped.result(timeout)
        except TimeoutError:
            return ReplicaStopped(self.replica, drained=False, error=f"not drained within {timeout:g} s")

    # ------------------------------------------------------------------ the host's thread
    def _run(self) -> None:
        stopped: ReplicaStopped | None = None
        try:
            anyio.run(self._main, backend="asyncio", backend_options={"use_uvloop": True})
        except BaseException as exc:
            error = first_error(exc)
            text = str(error).split(" at /")[0] or type(error).__name__  # zenoh appends its source paths
            bad_config = isinstance(error, PolicyLoadError | ConfigError)
            if not isinstance(error, OSError | zenoh.ZError | PolicyLoadError | ConfigError):
                log.exception("replica server crashed", replica=self.replica)
            self._resolve_ready(ReplicaFailed(self.replica, text, bad_config=bad_config))
            stopped = ReplicaStopped(self.replica, drained=False, error=text)
        finally:
            self._resolve_ready(ReplicaFailed(self.replica, "drained before it was ready"))
            with self._lock:
                requested = self._drain_requested
            if stopped is None:
                stopped = ReplicaStopped(self.replica, drained=requested, error="" if requested else "server stopped")
            self._stopped.set_result(stopped)

    async def _main(self) -> None:
        with anyio.CancelScope() as scope:
            server = PolicyServer(
                self._manifest, policy=self._policy, search_path=self._search_path, identity=self._identity
            )
            with self._lock:
                if self._drain_requested:
                    return
                self._scope, self._server = scope, server
                self._bridge = LoopBridge()
            async with anyio.create_task_group() as tg:
                ready: ServerReady = await tg.start(server.run)
                self._resolve_ready(self._ready_status(ready))
        with self._lock:
            self._bridge = None

    def _stop(self) -> None:
        """On the host's loop: drain a serving server, abandon one still starting."""
        assert self._server is not None
        assert self._scope is not None
        if self._ready.done():
            self._server.drain()
        else:
            self._scope.cancel()

    def _ready_status(self, ready: ServerReady) -> ReplicaReady:
        return ReplicaReady(
            replica=self.replica,
            key=ready.keys.prefix,
            model=ready.info.model,
            revision=ready.info.revision,
            pid=os.getpid(),
            host=socket.gethostname(),
            health_port=ready.health_port,
        )

    def _resolve_ready(self, status: ReplicaReady | ReplicaFailed) -> None:
        if not self._ready.done():
            self._ready.set_result(status)
