"""openpi's WebSocket policy protocol in front of a servo server (``[frontends.openpi]``).

What an openpi client (``openpi_client.websocket_client_policy.WebsocketClientPolicy``) sees:

- ``GET /healthz`` on the same port: 200 ``OK`` while the server serves, 503 otherwise.
- On connect, one binary msgpack frame: the manifest's ``metadata`` table plus ``"servo"``, the
  policy's description (`servo.wire.openpi.policy_metadata`: names, cameras, chunk size, fps,
  the observation keys read).
- Each binary msgpack-numpy observation dict is answered with ``{"actions": (T, A) float32,
  "server_timing": {"infer_ms", "queue_wait_ms", "prev_total_ms"}, "policy_timing":
  {"infer_ms"}, "servo": {"seq_id", "episode_id"}}``; ``{"__ctrl__": "episode_start"}`` starts a
  new servo episode (the session's processor is reset) and is acknowledged with
  ``{"__ack__": "episode_start"}``.
- A request that cannot be served (a bad observation, a policy error, a timeout) is answered with
  one text frame, ``servo: …`` naming the problem: openpi's client raises it as a RuntimeError
  and the connection stays usable for the next request.
- The connection is closed with a reason when it cannot go on: 1013 when the server is full,
  1001 when it drains, 1009 for a message over ``max_message_bytes``, 1011 otherwise. More than
  ``max_connections`` at once are refused with HTTP 503.
- Off loopback: ``wss://`` and an API key (HTTP 401 without a valid one), per-client budgets
  (HTTP 429): `servo.frontends.openpi_gate`.

Each connection is one servo session, opened through an in-process `PolicyClient` on the
server's own Zenoh session: fairness with the robots, per-session processors, the audit log and
the metrics are the robots', the capacity is the door's own (``max_connections``: openpi
clients never take a robot's slot), and the front door depends on nothing but the client's
public API. A client with an API key is named after it (``openpi-<name>-…``). One request is
in flight per connection (openpi's protocol is strictly
request/reply), paced to ``max_request_rate_hz``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import anyio
import zenoh
from anyio.abc import TaskStatus
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.http11 import Request, Response

from servo.access import Access, Caller
from servo.client import (
    PolicyClient,
    RemoteSession,
    RequestTimeout,
    ServerError,
    ServerInfo,
    SessionLost,
    SessionRejected,
    TrustedServers,
)
from servo.config import ConfigError
from servo.errors import ServoError
from servo.frontends.openpi_gate import OpenpiGate, respond
from servo.frontends.openpi_link import Link
from servo.identity import Identity
from servo.logs import Logger, get_logger
from servo.server import robots
from servo.server.manifest import OpenpiSection
from servo.wire import ServerKeys, WireError
from servo.wire.openpi import (
    CONTROL_KEY,
    action_reply,
    frame_sizes,
    pack,
    policy_metadata,
    read_observation,
    unpack,
)

log = get_logger(__name__)
#: websockets logs through stdlib logging with %-style arguments.
_ws_log = logging.getLogger(f"{__name__}.websockets")

#: How long closing connections may take when the server stops.
CLOSE_TIMEOUT_S = 5.0
#: A WebSocket close reason is at most 123 bytes of UTF-8 (RFC 6455 §5.5).
_MAX_REASON_BYTES = 123


class _Close(ServoError):
    """Ends a connection with a close code and reason."""

    def __init__(self, code: CloseCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class OpenpiFrontDoor:
    """Serves openpi's WebSocket protocol from a `PolicyServer` (a `servo.server.frontend.Frontend`).

    Owned by the server's event loop. Each connection is handled by its own asyncio task
    (created by ``websockets``' server on that loop), which owns the connection's servo session.

    Args:
        settings: The manifest's ``[frontends.openpi]``.
        gate: Who may connect, over what (`servo.frontends.openpi_gate`).
    """

    name = "openpi"

    def __init__(self, settings: OpenpiSection, gate: OpenpiGate) -> None:
        self.settings = settings
        self._gate = gate
        self._callers: dict[ServerConnection, Caller] = {}
        self._target: ServerInfo | None = None
        self._target_at = 0.0
        self._keys: ServerKeys | None = None
        self._zsession: zenoh.Session | None = None
        self._health: Callable[[], tuple[bool, str]] = lambda: (False, "starting")
        self._active = 0
        self._identity: Identity | None = None

    async def run(
        self,
        zsession: zenoh.Session,
        keys: ServerKeys,
        health: Callable[[], tuple[bool, str]],
        identity: Identity,
        access: Access,
        *,
        task_status: TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen until cancelled; ``task_status.started(url)`` once listening.

        Raises:
            ConfigError: the observation mapping names a camera the policy does not have, or the
                door is off loopback without TLS and without ``insecure``.
            OSError: the port cannot be bound (named with the setting that chose it).
        """
        s = self.settings
        tls = self._gate.ssl_context()
        self._gate.access = access
        self._zsession, self._health, self._identity = zsession, health, identity
        self._keys = keys
        self._target = await self._own_replica()
        self._check_cameras(self._target)
        try:
            server = await serve(
                self._handle,
                s.host,
                s.port,
                compression=None,  # as openpi's own client and server: no deflate CPU or bombs
                max_size=s.max_message_bytes,
                max_queue=2,  # one request in flight: a peer pipelining more waits in TCP
                process_request=self._http,
                logger=_ws_log,
                ssl=tls,
            )
        except OSError as exc:
            raise OSError(exc.errno, f"frontends.openpi.listen {s.listen}: {exc.strerror}") from exc
        port = server.sockets[0].getsockname()[1]
        url = f"{'ws' if tls is None else 'wss'}://{s.host}:{port}"
        log.info(
            "openpi front door listening", url=url, max_connections=s.max_connections, api_keys=self._gate.keys_required
        )
        try:
            task_status.started(url)
            await anyio.sleep_forever()
        finally:
            await self._shut(server)

    async def _own_replica(self) -> ServerInfo:
        """This server as a client discovers it, pinned by its identity (others may answer too).

        Every session then opens against this status, so its ack must be signed by the identity.
        """
        assert self._zsession is not None
        assert self._keys is not None
        keys = self._keys
        servers = await self._client(self._zsession).discover(app=keys.app, model=keys.model)
        for server in servers:
            if server.keys == keys:
                self._target_at = time.monotonic()
                return server
        raise RuntimeError(f"the openpi front door cannot see its own server {keys.prefix}")

    async def _current(self) -> ServerInfo:
        """This server's status with a nonce it still accepts: asked again once half a nonce period old.

        A session open carries the nonce of the status it opens against; an older one is refused
        (``stale_nonce``) and asked again, which a normal connection should never cost.
        """
        if self._target is None or time.monotonic() - self._target_at > robots.NONCE_PERIOD_S / 2:
            self._target = await self._own_replica()
        return self._target

    def _client(self, zsession: zenoh.Session, client_id: str | None = None) -> PolicyClient:
        """A client of this server only: pinned to its identity, signing its opens with it."""
        assert self._identity is not None
        trusted = TrustedServers(identities=frozenset({self._identity.public_key}))
        return PolicyClient(zsession, client_id, jpeg_quality=0, trusted=trusted, identity=self._identity)

    def _check_cameras(self, target: ServerInfo) -> None:
        cameras = target.status.policy.features.cameras
        for name in self.settings.observation.cameras:
            if name not in cameras:
                raise ConfigError(
                    f"frontends.openpi.observation.cameras.{name}: the policy has no camera {name!r} "
                    f"(it has {', '.join(cameras) or 'none'})"
                )

    async def _shut(self, server: Server) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT_S):
            server.close(code=CloseCode.GOING_AWAY, reason="servo server draining")
            await server.wait_closed()

    # ------------------------------------------------------------------ HTTP
    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        """Answers ``/healthz``; refuses a stranger, or a connection over a limit, before the upgrade."""
        if request.path.split("?", 1)[0] == "/healthz":
            serving, state = self._health()
            return respond(HTTPStatus.OK, "OK\n") if serving else respond(HTTPStatus.SERVICE_UNAVAILABLE, f"{state}\n")
        caller = self._gate.admit(request, _peer(connection.remote_address))
        if isinstance(caller, Response):
            return caller
        if self._active >= self.settings.max_connections:
            return respond(HTTPStatus.SERVICE_UNAVAILABLE, f"servo: {self._full()}\n")
        self._callers[connection] = caller
        return None

    def _full(self) -> str:
        return f"too many openpi connections (max_connections = {self.settings.max_connections})"

    # ------------------------------------------------------------------ connections
    async def _handle(self, ws: ServerConnection) -> None:
        self._active += 1
        caller = self._callers.pop(ws, None)
        try:
            if caller is None:  # every upgrade passes `_http` first
                raise _Close(CloseCode.POLICY_VIOLATION, "servo: not admitted")
            if self._active > self.settings.max_connections:  # handshakes racing past `_http`
                raise _Close(CloseCode.TRY_AGAIN_LATER, self._full())
            await self._connection(ws, caller)
        except _Close as close:
            await ws.close(close.code, _reason(close.reason))
        except ConnectionClosed:
            pass
        finally:
            self._active -= 1

    async def _connection(self, ws: ServerConnection, caller: Caller) -> None:
        assert self._zsession is not None
        assert self._target is not None
        s = self.settings
        peer = _peer(ws.remote_address)
        named = f"{caller.name}-" if caller.name else ""
        client = self._client(self._zsession, f"openpi-{named}{uuid.uuid4().hex[:12]}")
        link = Link(client, self._current, peer)
        bound = log.bind(client_id=link.client.client_id, peer=peer)
        try:
            session = await link.open(self._target.status.policy.features.cameras)
        except SessionRejected as exc:
            code = {"capacity": CloseCode.TRY_AGAIN_LATER, "draining": CloseCode.GOING_AWAY}.get(
                exc.rejection.code, CloseCode.INTERNAL_ERROR
            )
            bound.info("openpi connection refused", reason=str(exc))
            raise _Close(code, f"servo refused the session: {exc}") from None
        except RequestTimeout as exc:
            raise _Close(CloseCode.INTERNAL_ERROR, f"servo: {exc}") from None
        bound.info("openpi connection opened", session_id=session.session_id)
        try:
            assert session.ack is not None
            info = self._target.status.policy
            metadata = policy_metadata(info, s.observation, replica=self._target.keys.replica, task=session.ack.task)
            await ws.send(pack({**s.metadata, "servo": metadata}))
            await self._requests(ws, link, bound, caller)
        finally:
            with anyio.CancelScope(shield=True):
                await link.close()
            bound.info("openpi connection closed", requests=link.requests)

    async def _requests(self, ws: ServerConnection, link: Link, bound: Logger, caller: Caller) -> None:
        interval = 1.0 / self.settings.max_request_rate_hz
        next_start = 0.0
        prev_total_ms: float | None = None
        while True:
            message = await ws.recv()
            if (revoked := self._gate.revoked(caller)) is not None:
                bound.info("openpi connection closed: key revoked", holder=caller.name)
                raise _Close(CloseCode.POLICY_VIOLATION, revoked)
            now = time.monotonic()
            if now < next_start:
                await anyio.sleep(next_start - now)  # pacing: the peer's next frames wait in TCP
            started = time.monotonic()
            next_start = started + interval
            reply = await self._answer(message, link, prev_total_ms, bound)
            await ws.send(reply)
            if isinstance(reply, bytes):
                prev_total_ms = (time.monotonic() - started) * 1e3

    async def _answer(
        self, message: str | bytes, link: Link, prev_total_ms: float | None, bound: Logger
    ) -> bytes | str:
        """The reply to one frame: msgpack bytes, or one text line naming what went wrong."""
        s = self.settings
        if isinstance(message, str):
            return "servo: bad request: expected a binary msgpack frame, got text"
        try:
            obs = unpack(message, max_bytes=s.max_message_bytes)
            if isinstance(obs, dict) and CONTROL_KEY in obs:
                return pack(await self._control(obs[CONTROL_KEY], link.session))
            assert self._target is not None
            inputs = read_observation(obs, s.observation, self._target.status.policy.features)
        except WireError as exc:
            bound.debug("openpi observation refused", error=str(exc))
            return f"servo: bad observation: {exc}"
        except (ServerError, RequestTimeout) as exc:
            return f"servo: {exc}"
        try:
            session = await link.fit(frame_sizes(inputs.images), bound)
        except SessionRejected as exc:
            return f"servo: bad observation: frames of this size refused: {exc}"
        except RequestTimeout as exc:
            return f"servo: {exc}"
        started = time.monotonic()
        try:
            result = await session.infer(inputs.state, inputs.images, task=inputs.prompt, timeout=s.request_timeout_s)
        except ServerError as exc:
            if exc.code == "unknown_session":
                raise _Close(CloseCode.INTERNAL_ERROR, f"servo: {exc}") from None
            return f"servo: {exc}"
        except RequestTimeout as exc:
            return f"servo: {exc}"
        except SessionLost as exc:
            code = CloseCode.GOING_AWAY if "draining" in str(exc) else CloseCode.INTERNAL_ERROR
            raise _Close(code, f"servo: {exc}") from None
        return pack(
            action_reply(
                result.chunk_robot,
                infer_ms=(time.monotonic() - started) * 1e3,
                policy_ms=result.inference_ms,
                queue_wait_ms=result.queue_wait_ms,
                seq_id=result.seq_id,
                episode_id=result.episode_id,
                prev_total_ms=prev_total_ms,
            )
        )

    async def _control(self, command: Any, session: RemoteSession) -> dict[str, Any]:
        """Answer openpi's control messages; an episode start is a servo episode reset."""
        if command == "episode_start":
            await session.reset(session.episode_id + 1)
            return {"__ack__": "episode_start", "servo": {"episode_id": session.episode_id}}
        if command == "episode_end":
            return {"__ack__": "episode_end"}
        return {"__ack__": "ignored"}


def _peer(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)


def _reason(text: str) -> str:
    data = text.encode()
    if len(data) <= _MAX_REASON_BYTES:
        return text
    return data[: _MAX_REASON_BYTES - 3].decode(errors="ignore") + "…"
