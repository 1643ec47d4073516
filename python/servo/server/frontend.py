"""The seam other protocols enter a servo server through (`servo.frontends`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import zenoh
from anyio.abc import TaskStatus

from servo.access import Access
from servo.identity import Identity
from servo.wire import ServerKeys


class Frontend(Protocol):
    """Another way into the server, e.g. openpi's WebSocket protocol (`servo.frontends`).

    Runs on the server's event loop from the moment the server serves until its drain has told
    every session; it reaches the policy only through ordinary sessions opened on the server's
    own Zenoh session, so admission, scheduling and metrics are the robots'.
    """

    name: str

    async def run(
        self,
        zsession: zenoh.Session,
        keys: ServerKeys,
        health: Callable[[], tuple[bool, str]],
        identity: Identity,
        access: Access,
        *,
        task_status: TaskStatus[str],
    ) -> None:
        """Serve until cancelled; ``task_status.started(url)`` once listening.

        Args:
            zsession: The server's own Zenoh session, to open sessions on.
            keys: This replica's keys.
            health: ``(serving, lifecycle state)`` of the server, for a health check.
            identity: This replica's identity: pin its public key, so no other peer can pose as
                this server, and sign the frontend's session opens with it (always admitted).
            access: The server's admission rule: who the frontend's own callers are (`servo.access`).
            task_status: Reports where the frontend listens.
        """
