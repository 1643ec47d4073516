"""Who may connect to the openpi door, and over what: TLS, API keys and per-client budgets.

The door follows the server's one admission rule (`servo.access`):

* **On loopback** (``127.0.0.1:8000``, the default) only this machine's processes reach it: plain
  ``ws://``, no key asked, as openpi's own server.
* **Off loopback** it speaks TLS (``wss://``) with ``[frontends.openpi] certificate`` (``servo-serve``
  puts its self-signed one there when none is named), or refuses to start; ``--insecure`` accepts
  plain ``ws://`` (anyone on the path then reads observations and actions). And every connection
  must present an API key (``Authorization: Api-Key servo-api-v1.…``, what
  ``openpi_client.WebsocketClientPolicy(host, port, api_key=…)`` sends), checked against the
  roster's hashes before the WebSocket upgrade: a stranger is answered 401 and costs no session;
  ``--allow-any-robot`` lets clients in without one. A key revoked (``servo-serve robots
  revoke-key``) or expired closes the connections it opened, before their next request.
* **Budgets per client**: each API key (or, without keys, each peer address) may open
  ``[limits] client_opens_per_s`` connections per second (burst ``client_open_burst``); more are
  answered 429 before the upgrade. The door's sessions have a capacity of their own
  (``max_connections``), apart from the robots' (`servo.server.sessions.SessionRegistry.robots`).
"""

from __future__ import annotations

import ssl
import time
from http import HTTPStatus

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from servo.access import Access, Caller, Denied
from servo.config import ConfigError
from servo.server.admission import KeyedBuckets
from servo.server.manifest import LimitsSection, OpenpiSection
from servo.transport import loopback_host


def respond(status: HTTPStatus, text: str) -> Response:
    """A plain-text HTTP response that closes the connection."""
    body = text.encode()
    headers = Headers(
        [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))), ("Connection", "close")]
    )
    return Response(status.value, status.phrase, headers, body)


class OpenpiGate:
    """The openpi door's admission (module docstring). Owned by the server's event loop.

    Args:
        settings: ``[frontends.openpi]``.
        limits: ``[limits]`` (the per-client open budget).
        insecure: ``[security] insecure``: plain ``ws://`` off loopback is accepted.
        any_client: ``[security] allow_any_robot``: no API key asked off loopback.
    """

    def __init__(self, settings: OpenpiSection, limits: LimitsSection, *, insecure: bool, any_client: bool) -> None:
        self.settings = settings
        self.off_loopback = not loopback_host(settings.host)
        self.keys_required = self.off_loopback and not any_client
        self._insecure = insecure
        self._opens = KeyedBuckets(limits.client_opens_per_s, limits.client_open_burst)
        self.access: Access | None = None

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context the door listens with; None for plain ``ws://``.

        Raises:
            ConfigError: off loopback without a certificate and without ``insecure``.
        """
        s = self.settings
        if not s.certificate:
            if self.off_loopback and not self._insecure:
                raise ConfigError(
                    f"frontends.openpi.listen: {s.listen!r} is not loopback and the door has no TLS certificate: "
                    "anyone on the network would read its observations and actions; set frontends.openpi."
                    "certificate and private_key (servo-serve uses its self-signed one), or accept plain ws:// "
                    "with --insecure ([security] insecure = true)"
                )
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(s.certificate, s.private_key)
        return context

    def revoked(self, caller: Caller) -> str | None:
        """Why ``caller``, admitted at its upgrade, is admitted no longer (its key revoked or expired); None: it is.

        Asked before each request: ``servo-serve robots revoke-key`` closes a connection open now.
        """
        if not self.keys_required or self.access is None:
            return None
        stored = self.access.rules.api_keys.get(caller.key.decode())
        if stored is None or stored.name != caller.name:
            return f"servo: the API key of {caller.name!r} was revoked"
        if stored.expires and time.time() >= stored.expires:
            return f"servo: the API key of {caller.name!r} has expired"
        return None

    def admit(self, request: Request, peer: str) -> Caller | Response:
        """The caller ``request`` (a WebSocket upgrade from ``peer``) proves, or the HTTP answer refusing it."""
        caller: Caller | Denied
        if self.keys_required:
            assert self.access is not None
            caller = self.access.api_key(request.headers.get("Authorization"))
        else:
            caller = Caller("openpi", "", b"", enrolled=False)
        if isinstance(caller, Denied):
            return respond(HTTPStatus.UNAUTHORIZED, f"servo: {caller.reason}\n")
        budget = caller.name or peer.rpartition(":")[0]
        if not self._opens.take(budget):
            return respond(HTTPStatus.TOO_MANY_REQUESTS, f"servo: too many connections by {budget!r}; retry\n")
        return caller
