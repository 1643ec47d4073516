"""One openpi connection's servo session (`servo.frontends.openpi`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import msgspec

from servo.client import PolicyClient, RemoteSession, ServerInfo
from servo.logs import Logger
from servo.wire import CameraFeature


class Link:
    """One connection's servo session, whose camera sizes follow the frames the client sends.

    A robot declares its cameras' sizes when it opens its session and the server resizes every
    frame to the policy's input; an openpi client says nothing about its frames until it sends
    them. The session opens with the policy's own sizes (so capacity is taken and refused at
    connect), and is reopened on the first frames of another size, proving it held the old one so
    the server swaps them in place. Owned by the connection's task.
    """

    def __init__(self, client: PolicyClient, target: Callable[[], Awaitable[ServerInfo]], peer: str) -> None:
        self.client = client
        self._target = target
        self._tags = {"frontend": "openpi", "peer": peer}
        self._session: RemoteSession | None = None
        self._cameras: dict[str, CameraFeature] = {}
        self.requests = 0

    @property
    def session(self) -> RemoteSession:
        """The session requests go to."""
        assert self._session is not None
        return self._session

    async def open(self, cameras: dict[str, CameraFeature]) -> RemoteSession:
        """Open a session declaring ``cameras``, replacing the current one (if any) on the server.

        Raises:
            SessionRejected: the server refused (the current session stays).
            RequestTimeout: the server did not answer (the current session stays).
        """
        target = await self._target()
        policy = target.status.policy
        features = msgspec.structs.replace(policy.features, cameras=cameras)
        previous = self._session
        session = await self.client.open_session(
            target, features=features, fps=policy.fps, tags=self._tags, previous=previous
        )
        self._session, self._cameras = session, dict(cameras)
        if previous is not None:
            self.requests += previous.stats.sent
            with anyio.CancelScope(shield=True):
                await previous.close()
        return session

    async def fit(self, sizes: dict[str, CameraFeature], bound: Logger) -> RemoteSession:
        """The session, reopened first when ``sizes`` are not the ones it declared."""
        if sizes != self._cameras:
            shown = {name: f"{size.height}x{size.width}" for name, size in sizes.items()}
            bound.info("openpi frames change size: session reopened", cameras=shown)
            await self.open(sizes)
        return self.session

    async def close(self) -> None:
        """Close the session (best effort)."""
        if self._session is not None:
            self.requests += self._session.stats.sent
            await self._session.close()
            self._session = None
