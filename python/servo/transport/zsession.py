"""Opening and closing Zenoh sessions from async code.

A Zenoh session whose callbacks are still declared keeps a non-daemon thread alive and hangs
interpreter exit, and ``atexit`` runs too late to help (docs/design/zenoh.md §9). Every Zenoh session in servo
is therefore opened through `open_zsession`, which closes it on every exit path. In servo's
vocabulary a Zenoh session is a *zsession*; a *session* is a servo session (a robot's
authenticated conversation with one replica, `servo.client.RemoteSession`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

import anyio
import zenoh

from servo.logs import get_logger
from servo.transport.config import ACCEPT_PENDING, ZenohSettings

log = get_logger(__name__)

#: zenoh's own close gives up after 10 s (e.g. when a peer is wedged); we wait a little longer.
CLOSE_TIMEOUT_S = 12.0
#: Descriptors a listening process asks for (up to its hard limit; the systemd unit's): its pending
#: links, and every other door's pending connections (HTTP, the openpi door), many times over.
OPEN_FILES = 64 * ACCEPT_PENDING


@asynccontextmanager
async def open_zsession(settings: ZenohSettings | zenoh.Config) -> AsyncIterator[zenoh.Session]:
    """Open a Zenoh session off the event loop and always close it.

    Args:
        settings: The settings, or a config built from them and extended (the router adds its
            access control).

    Raises:
        zenoh.ZError: the Zenoh session could not be opened (a client with no reachable router).
    """
    config = settings.to_config() if isinstance(settings, ZenohSettings) else settings
    if json.loads(config.get_json("listen/endpoints")):
        _allow_open_files()
    zsession = await anyio.to_thread.run_sync(zenoh.open, config)
    log.debug("zenoh session open", zid=str(zsession.zid()), mode=json.loads(config.get_json("mode")))
    try:
        yield zsession
    finally:
        with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
            await anyio.to_thread.run_sync(_close_quietly, zsession, abandon_on_cancel=True)


def _allow_open_files() -> None:
    # A listener may hold ACCEPT_PENDING links in their handshake beside its sessions and files: a
    # soft limit of 1024 descriptors (common) would run out first, and then no robot gets in.
    if sys.platform == "win32":  # no descriptor limit to raise, and no `resource` module
        return
    import resource  # POSIX only: importing it at the top would break Windows

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def zenoh_message(exc: zenoh.ZError) -> str:
    """A Zenoh error for a person: zenoh appends source paths of its own build (`` at /root/.cargo/…``)."""
    return str(exc).split(" at /")[0].rstrip(" .!") or type(exc).__name__


class Declared(Protocol):
    """A Zenoh entity declared on a Zenoh session: subscriber, queryable, liveliness token, listener."""

    def undeclare(self) -> None:
        """Withdraw it (zenoh's own classes leave this unannotated)."""
        ...


def _close_quietly(zsession: zenoh.Session) -> None:
    try:
        zsession.close()
    except zenoh.ZError as exc:
        # A wedged peer makes close time out; the Zenoh session is unusable either way.
        log.warning("zenoh session close failed", error=str(exc))
