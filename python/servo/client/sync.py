"""`SyncPolicyClient`: servo for scripts, in openpi's shape — ``infer(obs) -> {"actions": ...}``.

A blocking facade over `PolicyClient`: an event loop (uvloop when available) runs on a daemon
thread of its own, with one Zenoh session and one servo session; each call hands a coroutine to
that loop and waits for it. Frames travel raw by default, so a policy sees exactly the pixels
given (a LeRobot checkpoint then computes the numbers LeRobot computes); JPEG (``jpeg_quality``
1-100, or ``"auto"`` to choose per request from measured costs) trades those exact numbers for
fewer bytes on a slow link. Closing is deterministic (``close()`` or the ``with`` block). The
Zenoh callback threads are started from the loop thread and inherit its daemon flag, so nothing
of the client holds the interpreter at exit (docs/design/zenoh.md §9); a client the program never closed
is closed properly at exit, so the server ends its session at once instead of collecting it
after its grace period. Exit then waits for those callback threads to end: one still parked in
Zenoh when the interpreter finalises is killed there, which aborts the process. Never imports torch.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Literal, Self, TypeVar, TypeVarTuple

import anyio
from anyio.from_thread import BlockingPortal

from servo.client.policy_client import PolicyClient
from servo.client.session import RemoteSession
from servo.client.trust import TrustedServers
from servo.transport import ZenohSettings
from servo.wire import Features
from servo.wire.openpi import ObservationKeys, action_reply, check_sizes, policy_metadata, read_observation

#: How long `SyncPolicyClient.close` waits for the loop thread (a wedged Zenoh close gives up at 12 s).
CLOSE_TIMEOUT_S = 15.0
#: How long exit waits for the Zenoh callback threads of closed clients to end (ms when all is well).
EXIT_JOIN_TIMEOUT_S = 5.0

T = TypeVar("T")
Args = TypeVarTuple("Args")


class SyncPolicyClient:
    """A blocking servo client with openpi's ``infer`` and servo's episodes and metadata.

    Opens a Zenoh session and a servo session on the least-loaded server that accepts it when
    constructed; every method may be called from any thread (calls are serialised: one request in
    flight). The loop thread and the Zenoh session belong to this object until `close`.

    Args:
        connect: Zenoh endpoint(s) of a server or router, e.g. ``"tcp/gpu-box:7447"``.
        zenoh: Full Zenoh settings (TLS, mode); replaces ``connect`` when given.
        app: Only servers of this app.
        model: Only servers of this model (its key segment).
        features: What this client sends; the server's own features when omitted.
        fps: This client's control rate; the policy's when omitted.
        task: The session's task (VLA prompt) when an observation names none.
        observation: Where state, frames and prompt are in the observation dicts.
        client_id: This client's id (a key segment); a random one when omitted.
        jpeg_quality: 0 (the default) sends raw pixels: the policy computes on exactly these
            frames. 1-100 encodes JPEG at that quality, ``"auto"`` picks raw or JPEG per request
            from measured costs. JPEG saves bytes on a slow link (a raw 480x640 frame is 0.9 MB),
            but the policy then sees slightly different pixels, so its chunks are no longer
            exactly those of the same observation computed locally.
        timeout: Per-request timeout (s).
        trusted_servers: Pins (``ed25519:…`` fingerprints and/or replica ids, see
            `TrustedServers`); any server when empty.

    Raises:
        NoServerFound: no (trusted) server answered.
        SessionRejected: every server refused the session.
        WireError: a malformed ``trusted_servers`` entry.
    """

    def __init__(
        self,
        connect: str | Sequence[str] = "tcp/127.0.0.1:7447",
        *,
        zenoh: ZenohSettings | None = None,
        app: str | None = None,
        model: str | None = None,
        features: Features | None = None,
        fps: float | None = None,
        task: str = "",
        observation: ObservationKeys | None = None,
        client_id: str | None = None,
        jpeg_quality: int | Literal["auto"] = 0,
        timeout: float = 5.0,
        trusted_servers: Sequence[str] = (),
    ) -> None:
        endpoints = [connect] if isinstance(connect, str) else list(connect)
        self._settings = zenoh or ZenohSettings(mode="client", connect=endpoints)
        self._keys = observation or ObservationKeys()
        self._timeout = timeout
        self._trusted = TrustedServers.parse(trusted_servers)
        self._lock = threading.Lock()
        self._loop = _LoopThread()
        self._stack = AsyncExitStack()
        self._session: RemoteSession | None = None
        #: What the session declared it sends: frames must have its cameras' sizes.
        self._features: Features | None = None
        try:
            self._session = self._loop.call(self._open, app, model, features, fps, task, client_id, jpeg_quality)
        except BaseException:
            self._loop.stop()
            raise
        _OPEN.add(self)
        _USED.set()

    async def _open(
        self,
        app: str | None,
        model: str | None,
        features: Features | None,
        fps: float | None,
        task: str,
        client_id: str | None,
        jpeg_quality: int | Literal["auto"],
    ) -> RemoteSession:
        client = await self._stack.enter_async_context(
            PolicyClient.connect(self._settings, client_id, jpeg_quality=jpeg_quality, trusted=self._trusted)
        )
        try:
            if features is None or fps is None:
                policy = (await client.discover(app=app, model=model))[0].status.policy
                features = features or policy.features
                fps = fps or policy.fps
            session = await client.connect_best(features=features, fps=fps, app=app, model=model, task=task)
            self._stack.push_async_callback(session.close)
            self._features = features
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._stack.aclose()
            raise
        return session

    # ------------------------------------------------------------------ the openpi surface
    def infer(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        """One round trip: an openpi observation dict in, ``{"actions": (T, A), ...}`` out.

        ``obs`` holds the state, the camera frames and optionally the prompt under the keys of
        ``observation`` (by default ``state``, ``images/<camera>`` and ``prompt``). The reply has
        openpi's ``actions`` (robot space, float32) and ``server_timing`` / ``policy_timing``, plus
        ``servo`` (``seq_id``, ``episode_id``, ``round_trip_ms``).

        Raises:
            WireError: the observation does not fit the session's features (the key is named).
            ServerError: the server could not serve it (a policy error).
            RequestTimeout: no chunk within ``timeout``.
            SessionLost: the server drained or vanished.
        """
        return self._call(self._infer, obs)

    async def _infer(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        session = self._live()
        assert session.ack is not None
        assert self._features is not None
        inputs = read_observation(obs, self._keys, session.ack.policy.features)
        check_sizes(inputs, self._features.cameras, self._keys)
        result = await session.infer(inputs.state, inputs.images, task=inputs.prompt, timeout=self._timeout)
        reply = action_reply(
            result.chunk_robot,
            infer_ms=result.queue_wait_ms + result.inference_ms,
            policy_ms=result.inference_ms,
            queue_wait_ms=result.queue_wait_ms,
            seq_id=result.seq_id,
            episode_id=result.episode_id,
        )
        reply["servo"]["round_trip_ms"] = result.rtt_ns / 1e6
        return reply

    def get_server_metadata(self) -> dict[str, Any]:
        """What the server serves (openpi's name): model, names, cameras, chunk size, fps, task."""
        session = self._live()
        assert session.ack is not None
        return policy_metadata(session.ack.policy, self._keys, replica=session.ack.replica, task=session.ack.task)

    def reset(self, episode_id: int | None = None) -> int:
        """Start a new episode on the server (its per-session processor is reset); returns its id.

        Raises:
            ServerError: the server refused.
            RequestTimeout: no answer in time.
        """
        return self._call(self._reset, episode_id)

    async def _reset(self, episode_id: int | None) -> int:
        session = self._live()
        await session.reset(session.episode_id + 1 if episode_id is None else episode_id)
        return session.episode_id

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the servo session, the Zenoh session and the loop thread. Idempotent."""
        with self._lock:
            if self._session is None:
                return
            self._session = None
            _OPEN.discard(self)
            try:
                self._loop.call(self._stack.aclose)
            finally:
                self._loop.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _call(self, fn: Callable[[*Args], Awaitable[T]], *args: *Args) -> T:
        with self._lock:
            if self._session is None:
                raise RuntimeError("SyncPolicyClient is closed")
            return self._loop.call(fn, *args)

    def _live(self) -> RemoteSession:
        if self._session is None:
            raise RuntimeError("SyncPolicyClient is closed")
        return self._session


class _LoopThread:
    """An event loop on a daemon thread, reached through an anyio `BlockingPortal`.

    The thread runs the loop only; callers block in `call`.
    """

    def __init__(self) -> None:
        self._portal: BlockingPortal | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="servo-sync-client", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            anyio.run(self._serve, backend="asyncio", backend_options={"use_uvloop": True})
        except BaseException as exc:  # reported to the constructor if the loop never came up
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        async with BlockingPortal() as portal:
            self._portal = portal
            self._ready.set()
            await portal.sleep_until_stopped()

    def call(self, fn: Callable[[*Args], Awaitable[T]], *args: *Args) -> T:
        """Run ``await fn(*args)`` on the loop and return its result (re-raising its error)."""
        if self._portal is None:
            raise RuntimeError("the client's event loop is stopped")
        return self._portal.call(fn, *args)

    def stop(self) -> None:
        """Stop the loop (its tasks are cancelled) and join the thread."""
        portal, self._portal = self._portal, None
        if portal is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                portal.call(portal.stop, True)
        self._thread.join(CLOSE_TIMEOUT_S)


#: Clients not closed yet, closed by `_close_forgotten` at exit (held strongly until then).
_OPEN: set[SyncPolicyClient] = set()
#: Set once a client opened: only then does exit wait for Zenoh's callback threads.
_USED = threading.Event()


@atexit.register
def _close_forgotten() -> None:
    # Zenoh's callback threads are daemons here (see the module docstring), so Python reaches
    # atexit with the client's loop thread still running, and the close completes.
    for client in list(_OPEN):
        client.close()
    if _USED.is_set():
        _join_callback_threads(EXIT_JOIN_TIMEOUT_S)


def _join_callback_threads(timeout: float) -> None:
    """Wait until the Zenoh callback threads started from the clients' loop threads have ended.

    A closed session's callback thread wakes in Zenoh, takes the GIL once more and ends. Being a
    daemon, nothing else waits for it: if the interpreter finalises first, Python 3.11 ends the
    thread with ``pthread_exit`` inside pyo3's frames, and the forced unwind aborts the whole
    process ("FATAL: exception not rethrown"; seen in about 1 exit in 20 on a loaded machine).
    """
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread.daemon and thread.name.endswith("(pyo3-closure)"):
            thread.join(max(0.0, deadline - time.monotonic()))
