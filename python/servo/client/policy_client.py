"""`PolicyClient`: discover servers and open sessions.

The building block of the edge runtime, usable on its own from any anyio program. Never imports
torch.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import zenoh

from servo.client.errors import NoServerFound, SessionRejected
from servo.client.replies import request
from servo.client.session import RemoteSession, ServerInfo
from servo.logs import get_logger
from servo.transport import ZenohSettings, open_session, query
from servo.wire import (
    SUPPORTED_SCHEMA_VERSIONS,
    Features,
    ServerKeys,
    SessionAck,
    SessionOpen,
    StatusReply,
    Trajectory,
    TrajectoryRequest,
    WireError,
    decode,
    segment,
    status_selector,
)

log = get_logger(__name__)


class PolicyClient:
    """A robot's handle on the servo network. Owned by the event loop that uses it.

    Args:
        zsession: An open Zenoh session (see `connect` to have one opened and closed for you).
        client_id: This robot's id (a key segment); a random one when omitted.
        jpeg_quality: JPEG quality for camera frames, 0 sends raw pixels.
    """

    def __init__(self, zsession: zenoh.Session, client_id: str | None = None, *, jpeg_quality: int = 90) -> None:
        self.zsession = zsession
        self.client_id = segment(client_id or f"robot-{uuid.uuid4().hex[:12]}", what="client_id")
        self.jpeg_quality = jpeg_quality

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, settings: ZenohSettings, client_id: str | None = None, *, jpeg_quality: int = 90
    ) -> AsyncIterator[PolicyClient]:
        """Open a Zenoh session for the client and close it on exit."""
        async with open_session(settings) as zsession:
            yield cls(zsession, client_id, jpeg_quality=jpeg_quality)

    async def discover(
        self, *, app: str | None = None, model: str | None = None, timeout: float = 2.0
    ) -> list[ServerInfo]:
        """Ask every replica for its status; returns them least-loaded first.

        Raises:
            NoServerFound: nobody answered.
        """
        started = time.monotonic()
        replies = await query(self.zsession, status_selector(app, model), timeout=timeout)
        waited = time.monotonic() - started
        servers = []
        for reply in replies:
            if reply.ok is None:
                continue
            try:
                status = decode(reply.ok.payload.to_bytes(), StatusReply)
                keys = ServerKeys.parse_status(str(reply.ok.key_expr))
            except WireError as exc:
                log.warning("ignoring undecodable status reply", error=str(exc))
                continue
            servers.append(ServerInfo(keys, status))
        if not servers:
            where = status_selector(app, model)
            # Zenoh ends a query at once when no queryable matches: say so instead of a timeout.
            why = f"within {timeout:g} s" if waited >= timeout else "(none is reachable)"
            raise NoServerFound(f"no servo server answered on {where} {why}")
        return sorted(servers, key=lambda s: (s.status.draining, s.status.load, s.keys.replica))

    async def open_session(
        self,
        server: ServerInfo,
        *,
        features: Features,
        fps: float,
        task: str = "",
        rtc: bool = False,
        epoch: int = 0,
        tags: dict[str, str] | None = None,
        timeout: float = 2.0,
    ) -> RemoteSession:
        """Open (and validate) a session on ``server``.

        Raises:
            SessionRejected: the server refused; ``.rejection.code`` names the failed rule.
            RequestTimeout: the server did not answer.
        """
        session = RemoteSession(
            self.zsession,
            server,
            server.keys.client(self.client_id),
            epoch=epoch,
            jpeg_quality=self.jpeg_quality,
        )
        session.declare()
        try:
            opening = SessionOpen(
                client_id=self.client_id,
                schema_versions=list(SUPPORTED_SCHEMA_VERSIONS),
                features=features,
                fps=fps,
                task=task,
                rtc=rtc,
                session_epoch=epoch,
                tags=dict(tags or {}),
            )
            session.ack = await request(
                self.zsession,
                server.keys.session,
                opening,
                SessionAck,
                timeout=timeout,
                what="session open",
                rejected=SessionRejected,
            )
            await session.wait_matched(timeout)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await session.close()
            raise
        log.info(
            "session opened",
            session_id=session.session_id,
            client_id=self.client_id,
            replica=server.keys.replica,
            rtc=session.ack.rtc,
            warnings=session.ack.warnings,
        )
        return session

    async def fetch_trajectory(self, server: ServerInfo, name: str, *, timeout: float = 5.0) -> Trajectory:
        """Fetch a whole named trajectory from a server's library in one request.

        Raises:
            ServerError: the server has no such trajectory (the message lists what it has).
            RequestTimeout: no answer in time.
        """
        return await request(
            self.zsession,
            server.keys.trajectory,
            TrajectoryRequest(name),
            Trajectory,
            timeout=timeout,
            what=f"trajectory {name!r}",
        )

    async def connect_best(
        self,
        *,
        features: Features,
        fps: float,
        app: str | None = None,
        model: str | None = None,
        accept: Callable[[ServerInfo], bool] | None = None,
        **options: object,
    ) -> RemoteSession:
        """Discover, then open a session on the least-loaded replica that accepts us.

        A replica that is full or draining is skipped; any other rejection is final (the next
        replica of the same model would refuse for the same reason).
        """
        servers = [s for s in await self.discover(app=app, model=model) if accept is None or accept(s)]
        if not servers:
            raise NoServerFound("no discovered server matches the requested model")
        last: SessionRejected | None = None
        for server in servers:
            try:
                return await self.open_session(server, features=features, fps=fps, **options)  # type: ignore[arg-type]
            except SessionRejected as exc:
                if exc.rejection.code not in ("capacity", "draining"):
                    raise
                last = exc
        assert last is not None
        raise last
