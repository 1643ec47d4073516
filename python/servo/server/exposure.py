"""Nothing a server exposes by accident: each exposure needs its own explicit, named choice.

Checked when the manifest is read (`servo.server.manifest.Manifest.check`), so a server that
would expose something refuses to start, in one line naming the key, what it would expose, and
the flag that accepts it:

==========================================  =======================================================
exposure                                    accepted with
==========================================  =======================================================
a plain (not TLS) listen off loopback       ``--insecure`` (``[security] insecure``)
a plain connect to another host             ``--insecure`` (``[security] insecure``)
listening, or peer mode, beside a router    ``--listen-beside-router`` (``[security] listen_beside_router``)
``/healthz`` and ``/metrics`` off loopback  ``--expose-health`` (``[security] expose_health``)
==========================================  =======================================================

Two more follow from where the server is reachable (`reachable_off_loopback`) rather than refuse
to start: off loopback only enrolled robots may open sessions unless ``--allow-any-robot``
(`servo.access`), and the openpi door needs TLS unless ``--insecure`` and an API key unless
``--allow-any-robot`` (`servo.frontends.openpi`).
"""

from __future__ import annotations

from dataclasses import dataclass

from servo.config import FieldError
from servo.transport import ZenohSettings, exposed_endpoint, loopback_host, off_loopback


def reachable_off_loopback(zenoh: ZenohSettings) -> bool:
    """Whether other hosts can reach this server's Zenoh session (a listen or connect off loopback)."""
    return zenoh.multicast_scouting or any(off_loopback(e) for e in (*zenoh.listen, *zenoh.connect))


@dataclass(frozen=True)
class Accepted:
    """The exposures a manifest accepts (its ``[security]`` flags)."""

    insecure: bool = False
    listen_beside_router: bool = False
    expose_health: bool = False


def refuse_exposures(z: ZenohSettings, health: tuple[str, int], accepted: Accepted) -> None:
    """Raise `FieldError` for the first exposure nobody accepted (module docstring).

    Args:
        z: The manifest's ``[zenoh]``.
        health: ``ops.health_host`` and ``ops.health_port`` (0: none).
        accepted: What ``[security]`` accepts.
    """
    accept = "or accept that with --insecure ([security] insecure = true)"
    for field in ("listen", "connect"):
        for i, endpoint in enumerate(getattr(z, field)):
            if not accepted.insecure and exposed_endpoint(endpoint):
                fix = "listen on tls/ (docs/guides/security.md)" if field == "listen" else "connect over tls/"
                raise FieldError(
                    f"zenoh.{field}[{i}]",
                    f"{endpoint!r} is not TLS and not loopback: anyone on the network would read every robot's "
                    f"observations and chunks; {fix}, {accept}",
                )
    _refuse_beside_router(z, accepted.listen_beside_router)
    host, port = health
    if port and not loopback_host(host) and not accepted.expose_health:
        raise FieldError(
            "ops.health_host",
            f"{host!r} is not loopback: anyone on the network would read /metrics (robot names, request "
            "rates, refusals); scrape it from this host, or accept that with --expose-health "
            "([security] expose_health = true)",
        )


def _refuse_beside_router(z: ZenohSettings, allowed: bool) -> None:
    if not z.connect or allowed:
        return
    accept = "or accept that with --listen-beside-router ([security] listen_beside_router = true)"
    if z.listen:
        raise FieldError(
            "zenoh.listen",
            f"{z.listen[0]!r} beside connect {z.connect[0]!r}: peers reaching this port bypass the access "
            'control of the router connected to; set zenoh.listen = [] and zenoh.mode = "client" (servers '
            f"are clients of the router), {accept}",
        )
    if z.mode == "peer":
        # A peer dials every peer the router gossips about, with no listen endpoint of its own.
        raise FieldError(
            "zenoh.mode",
            f"'peer' with connect {z.connect[0]!r}: a peer links straight to every peer the router "
            "announces, and those links bypass the router's access control; set zenoh.mode = "
            f'"client" (servers are clients of the router), {accept}',
        )
