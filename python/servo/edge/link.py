"""How the remote engine joins the Zenoh network: a join token first, retries, no peer beside a router.

`open_link` runs before the first session:

1. With ``--join``, whom to trust comes from the token before anything is dialled
   (`servo.client.join`): the server's identity in ``known_servers``, and its certificate fetched
   and pinned when the token pins one and no ``--tls-root-ca`` is given (retried like the link).
2. The Zenoh session opens, retried until ``connect_timeout_s`` (a Zenoh client's ``open`` fails
   at once while nothing listens: docs/design/zenoh.md §1).
   A robot that dialled ``quic/`` first (``prefer_quic``) and is linked over TLS all the same
   dials again without QUIC when nothing answers QUIC there (a servo-router listens on TLS
   only; a firewall may drop UDP); when something does, the loss of a lossy link was to blame,
   and QUIC stays first.
3. A robot in ``peer`` mode that finds itself linked to a router is refused before it declares
   anything, unless ``--peer-beside-router``: the router announces every peer to every other
   one, and peers link directly, past the router's access control (another robot in peer mode
   read a robot's observations so).
"""

from __future__ import annotations

import contextlib
import secrets
import socket

import anyio
import msgspec
import zenoh

from servo.client.errors import UntrustedServer
from servo.client.join import JoinError, pinned_certificate, trust_server
from servo.client.known import deployment
from servo.edge.backoff import Backoff
from servo.edge.config import EdgeConfig
from servo.edge.errors import EdgeStartError
from servo.logs import get_logger
from servo.transport import open_zsession, zenoh_message

log = get_logger(__name__)

#: A long header with a version reserved for exercising negotiation (RFC 9000 §15), and the
#: length of the destination connection id that follows (then the source's: 8 bytes each).
_PROBE_HEAD = bytes([0xC0]) + bytes.fromhex("1a2a3a4a") + bytes([8])
_PROBE_BYTES = 1200
#: 5 probes 0.2 s apart: on a path that loses 20 % each way, all go unanswered once in 170.
_PROBES = 5
_PROBE_WAIT_S = 0.2


def _backoff(config: EdgeConfig) -> Backoff:
    link = config.link
    return Backoff(link.reconnect_initial_backoff_s, link.reconnect_max_backoff_s, deadline_s=link.connect_timeout_s)


async def prepare_join(config: EdgeConfig) -> EdgeConfig:
    """``config`` once its join token (if any) is acted on: its server trusted, its certificate pinned.

    Raises:
        EdgeStartError: the certificate cannot be fetched in time, or is not the one pinned.
    """
    token = config.security.join_token()
    if token is None:
        return config
    security, server = config.security, config.server
    selector = deployment(server.app or None, server.model or None)
    try:
        await anyio.to_thread.run_sync(trust_server, token, selector, security.known())
    except UntrustedServer as exc:
        raise EdgeStartError(str(exc), refused=True) from None
    if security.tls_root_ca or not token.certificate:
        return config
    backoff = _backoff(config)
    while True:
        try:
            path = await anyio.to_thread.run_sync(pinned_certificate, token, config.link.connect)
            break
        except JoinError as exc:
            if exc.refused or not await backoff.wait():
                raise EdgeStartError(str(exc), refused=exc.refused) from None
    if path is None:
        return config
    return msgspec.structs.replace(config, security=msgspec.structs.replace(security, tls_root_ca=str(path)))


async def open_link(config: EdgeConfig, stack: contextlib.AsyncExitStack) -> zenoh.Session:
    """The robot's Zenoh session, entered into ``stack`` (module docstring, steps 2 and 3).

    Raises:
        EdgeStartError: nothing answers within ``connect_timeout_s``, or peer mode beside a router.
    """
    backoff = _backoff(config)
    while True:
        try:
            zsession = await _open(config, stack)
            break
        except zenoh.ZError as exc:
            problem = zenoh_message(exc)
        if not await backoff.wait():
            raise no_server(config, problem)
    if config.link.zenoh_mode == "peer" and not config.security.peer_beside_router and zsession.info.routers_zid():
        raise EdgeStartError(
            f"link.zenoh_mode = 'peer' while {config.link.connect[0]!r} is a router: the peers it announces would "
            "link to this robot directly, past its access control; use --zenoh-mode client, or accept that with "
            "--peer-beside-router ([security] peer_beside_router = true)",
            refused=True,
        )
    return zsession


async def _open(config: EdgeConfig, stack: contextlib.AsyncExitStack) -> zenoh.Session:
    """The Zenoh session of ``config``; dialled again without QUIC if QUIC does not answer.

    Zenoh dials the whole list again at every reconnect: where nothing answers QUIC (a router,
    which listens on TLS only, or UDP dropped on the way), every redial of a lossy link would
    first wait for it (`servo.transport.config.QUIC_OPEN_TIMEOUT_MS`), so the session is opened
    again without it. A QUIC handshake lost to a lossy link keeps QUIC first: it is that link's
    best transport (docs/guides/bad-links.md).
    """
    settings = config.zenoh_settings()
    async with contextlib.AsyncExitStack() as first:
        zsession = await first.enter_async_context(open_zsession(settings))
        quic = [e for e in settings.connect if e not in config.link.connect]
        if not quic or _over_quic(zsession):
            stack.push_async_exit(first.pop_all())
            return zsession
        if not zsession.info.routers_zid() and await anyio.to_thread.run_sync(_quic_answers, quic):
            log.info("linked over TLS; QUIC answers, so it is dialled first again at a reconnect", quic=quic)
            stack.push_async_exit(first.pop_all())
            return zsession
    log.info("QUIC does not answer (a router, or UDP dropped): dialled again on TLS alone", quic=quic)
    return await stack.enter_async_context(
        open_zsession(msgspec.structs.replace(settings, connect=config.link.connect))
    )


def _over_quic(zsession: zenoh.Session) -> bool:
    return any(str(link.dst).startswith("quic/") for link in zsession.info.links())


def _quic_answers(endpoints: list[str]) -> bool:
    """Whether anything answers QUIC at one of ``endpoints`` (``quic/HOST:PORT``).

    A QUIC server answers a packet of a version it does not speak with a version negotiation
    packet (RFC 9000 §6), holding no state: a few such probes tell a lossy path (some come back)
    from one where UDP is dropped or nothing listens (none do). Nothing in an answer is trusted.
    """
    probe = _PROBE_HEAD + secrets.token_bytes(8) + bytes([8]) + secrets.token_bytes(8)
    probe += bytes(_PROBE_BYTES - len(probe))  # servers ignore Initial packets under 1200 bytes
    for endpoint in endpoints:
        host, _, port = endpoint.removeprefix("quic/").rpartition(":")
        try:
            family, _, _, _, address = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_DGRAM)[0]
        except (OSError, ValueError):
            continue
        with socket.socket(family, socket.SOCK_DGRAM) as udp:
            udp.settimeout(_PROBE_WAIT_S)
            udp.connect(address)  # the kernel drops datagrams from anybody else
            for _ in range(_PROBES):
                try:
                    udp.send(probe)
                    answer = udp.recv(2048)
                except ConnectionRefusedError:  # port unreachable: nothing listens there
                    break
                except OSError:  # a timeout
                    continue
                if len(answer) >= 5 and answer[0] & 0x80 and answer[1:5] == bytes(4):
                    return True
    return False


def no_server(config: EdgeConfig, problem: str) -> EdgeStartError:
    """The one-line start error when no usable server answered within ``connect_timeout_s``."""
    link = config.link
    return EdgeStartError(
        f"no usable servo server at {', '.join(link.connect)} within {link.connect_timeout_s:g} s ({problem}); "
        "is servo-serve running there? (--connect, --connect-timeout-s)",
        refused=False,
    )
