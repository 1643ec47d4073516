"""Running the router: a Zenoh session in router mode, opened from Python, with the fleet's ACL.

No zenohd binary is involved: eclipse-zenoh routes for its clients when a session is opened with
``mode = "router"`` (docs/design/zenoh.md §1, §7). Members connect in client mode; the router listens on
explicit endpoints only, never scouts, and refuses everything the fleet file does not allow.
"""

from __future__ import annotations

import contextlib
import errno
import json
import socket
from dataclasses import dataclass

import anyio
import zenoh
from anyio.abc import TaskStatus

from servo.errors import StartError
from servo.logs import get_logger
from servo.router.acl import access_control
from servo.router.fleet import Fleet
from servo.transport import TlsSettings, ZenohSettings, open_zsession, zenoh_message

log = get_logger(__name__)


class RouterStartError(StartError, RuntimeError):
    """The router could not open its endpoints; the message names the endpoint or the cause."""


@dataclass(frozen=True)
class RouterReady:
    """What `run_router` reports once the router accepts members (immutable)."""

    zid: str
    listen: list[str]
    connect: list[str]


def router_config(fleet: Fleet) -> zenoh.Config:
    """The Zenoh config of the router described by ``fleet``.

    Under mTLS the router presents its own certificate when it joins the routers in
    ``router.connect`` (the fleet file only allows a mesh under mTLS).
    """
    router = fleet.router
    tls = None
    if router.tls is not None:
        cert = router.tls.certificate if router.tls.mtls else None
        key = router.tls.private_key if router.tls.mtls else None
        tls = TlsSettings(
            root_ca_certificate=router.tls.root_ca,
            listen_certificate=router.tls.certificate,
            listen_private_key=router.tls.private_key,
            connect_certificate=cert,
            connect_private_key=key,
            enable_mtls=router.tls.mtls,
        )
    settings = ZenohSettings(
        mode="router",
        listen=list(router.listen),
        connect=list(router.connect),
        lease_ms=router.lease_ms,
        tls=tls,
        # Where fleet.toml says only (tcp/ or tls/): its access control is verified on those links.
        quic_beside_tls=False,
    )
    config = settings.to_config()
    values: dict[str, object] = {"access_control": access_control(fleet)}
    if not router.connect:
        # zenoh 1.10 sleeps scouting/delay (0.5 s) at every router start, scouting or not
        # (orchestrator.rs start_router). A router that joins others keeps it: members whose
        # declarations raced the first router link were lost in testing (tests/router/test_mesh).
        values["scouting/delay"] = 0
    if router.passwords_file is not None:
        values["transport/auth/usrpwd/dictionary_file"] = router.passwords_file
    for key, value in values.items():
        config.insert_json5(key, json.dumps(value))
    return config


async def run_router(fleet: Fleet, *, task_status: TaskStatus[RouterReady] = anyio.TASK_STATUS_IGNORED) -> None:
    """Route for the fleet until cancelled; the Zenoh session is closed on every exit path.

    Raises:
        RouterStartError: a listen endpoint is taken or unusable, or zenoh refused the config.
    """
    router = fleet.router
    async with contextlib.AsyncExitStack() as stack:
        try:
            zsession = await stack.enter_async_context(open_zsession(router_config(fleet)))
        except zenoh.ZError as exc:
            raise RouterStartError(_start_problem(fleet, exc)) from None
        zid = str(zsession.zid())
        log.debug(
            "router ready",
            zid=zid,
            listen=router.listen,
            connect=router.connect,
            servers=fleet.count("servers"),
            robots=fleet.count("robots"),
            monitors=fleet.count("monitors"),
            routers=fleet.count("routers"),
        )
        task_status.started(RouterReady(zid, list(router.listen), list(router.connect)))
        await anyio.sleep_forever()


def _start_problem(fleet: Fleet, exc: zenoh.ZError) -> str:
    for i, endpoint in enumerate(fleet.router.listen):
        problem = _bind_problem(endpoint)
        if problem is not None:
            return f"router.listen[{i}] = {endpoint!r}: {problem}"
    return f"zenoh refused to start the router: {zenoh_message(exc)}"


def _bind_problem(endpoint: str) -> str | None:
    """Why nobody can listen on ``endpoint`` right now (bound the way zenoh binds), or None."""
    host, _, port = endpoint.partition("/")[2].rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError) as exc:
        return f"cannot resolve {host!r}: {exc}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} is already in use"
            return f"cannot listen on {host}:{port}: {exc.strerror}"
    return None
