"""Opening and closing Zenoh sessions from async code.

A Zenoh session whose callbacks are still declared keeps a non-daemon thread alive and hangs
interpreter exit, and ``atexit`` runs too late to help (docs/design/zenoh.md §9). Every session in servo is
therefore opened through `open_session`, which closes it on every exit path.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

import anyio
import zenoh

from servo.logs import get_logger
from servo.transport.config import ZenohSettings

log = get_logger(__name__)

#: zenoh's own close gives up after 10 s (e.g. when a peer is wedged); we wait a little longer.
CLOSE_TIMEOUT_S = 12.0


@asynccontextmanager
async def open_session(settings: ZenohSettings | zenoh.Config) -> AsyncIterator[zenoh.Session]:
    """Open a session off the event loop and always close it.

    Args:
        settings: The settings, or a config built from them and extended (the router adds its
            access control).

    Raises:
        zenoh.ZError: the session could not be opened (a client with no reachable router).
    """
    config = settings.to_config() if isinstance(settings, ZenohSettings) else settings
    session = await anyio.to_thread.run_sync(zenoh.open, config)
    log.debug("zenoh session open", zid=str(session.zid()), mode=json.loads(config.get_json("mode")))
    try:
        yield session
    finally:
        with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
            await anyio.to_thread.run_sync(_close_quietly, session, abandon_on_cancel=True)


def zenoh_message(exc: zenoh.ZError) -> str:
    """A Zenoh error for a person: zenoh appends source paths of its own build (`` at /root/.cargo/…``)."""
    return str(exc).split(" at /")[0].rstrip(" .!") or type(exc).__name__


class Declared(Protocol):
    """A Zenoh entity declared on a session: subscriber, queryable, liveliness token, listener."""

    def undeclare(self) -> None:
        """Withdraw it (zenoh's own classes leave this unannotated)."""
        ...


def _close_quietly(session: zenoh.Session) -> None:
    try:
        session.close()
    except zenoh.ZError as exc:
        # A wedged peer makes close time out; the session is unusable either way.
        log.warning("zenoh session close failed", error=str(exc))
