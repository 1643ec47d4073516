"""Every door servo opens: each listening socket and each Zenoh declaration, who may use it, what guards it.

The one source of truth of the threat-model table in docs/guides/security.md (`markdown_table`
renders it; a test checks the page holds exactly that), and of the exposure census (``tests/security/test_census.py``),
which starts a server (loopback and ``tls/0.0.0.0``), an edge, a router, a monitor and the openpi
door, lists every socket they listen on and every key expression they declare, and fails on one
this table does not name, or on a stranger's unauthenticated use that succeeds where a row says it
is refused.

Key expressions use ``*`` for one chunk: ``@servo/<app>/<model>/<replica>/…``, clients under
``c/<client id>``, telemetry under ``@servo/@robots/<client id>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["DOORS", "Door", "markdown_table"]

Kind = Literal["socket", "queryable", "subscriber", "publisher", "liveliness token", "liveliness subscriber"]
Component = Literal["servo-serve", "servo-edge", "servo-router", "servo-monitor"]


@dataclass(frozen=True)
class Door:
    """One row of the threat model.

    Args:
        component: The program that opens it (the openpi door is part of ``servo-serve``).
        kind: A listening socket or a Zenoh declaration.
        where: For a socket, the setting that chooses it; for a declaration, its key expression.
        who: Who may use it.
        guard: What stops anybody else.
        stranger_refused: Whether a stranger's unauthenticated use is refused (the census tries
            it); False where the door is public by design (what it gives is in ``guard``).
    """

    component: Component
    kind: Kind
    where: str
    who: str
    guard: str
    stranger_refused: bool = True


_SESSION = "the robot holding the session"
_ROUTER_ACL = "servo-router's ACL (behind a router)"

DOORS: tuple[Door, ...] = (
    # ---------------------------------------------------------------- listening sockets
    Door(
        "servo-serve",
        "socket",
        "zenoh.listen (tcp/127.0.0.1:7447)",
        "this host's processes; off loopback: enrolled robots (join tokens), monitors",
        "plain text off loopback needs --insecure (TLS otherwise); off loopback only enrolled robots open "
        "sessions unless --allow-any-robot; every session message sealed",
    ),
    Door(
        "servo-serve",
        "socket",
        "ops.health_host:ops.health_port (127.0.0.1:9100)",
        "this host (a scraper, the orchestrator's probe)",
        "off loopback needs --expose-health; GET only, bounded request",
        stranger_refused=False,
    ),
    Door(
        "servo-serve",
        "socket",
        "frontends.openpi.listen (127.0.0.1:8000)",
        "openpi clients on this host; off loopback: holders of an API key",
        "off loopback: wss unless --insecure, an API key (hashed in the roster) unless --allow-any-robot, "
        "per-key open budget; a capacity of its own (max_connections)",
    ),
    Door(
        "servo-router",
        "socket",
        "[router] listen (tls/0.0.0.0:7447)",
        "fleet members named in the fleet file",
        "mTLS certificate (or password) per member, one role each, ACL default deny",
    ),
    Door(
        "servo-monitor",
        "socket",
        "--http-host:--http-port (127.0.0.1:9200)",
        "this host (the operator's browser, Prometheus)",
        "loopback by default; GET only, bounded request",
        stranger_refused=False,
    ),
    # ---------------------------------------------------------------- servo-serve declarations
    Door(
        "servo-serve",
        "queryable",
        "@servo/*/*/*/status",
        "anyone on the link (discovery)",
        "public by design: capabilities, load, identity, a nonce; no robot names",
        stranger_refused=False,
    ),
    Door(
        "servo-serve",
        "queryable",
        "@servo/*/*/*/c/*/session",
        "enrolled robots (any robot on an open door)",
        "signed by the robot's identity over a fresh nonce; enrolment or a join token's proof; budgets per key",
    ),
    Door(
        "servo-serve",
        "queryable",
        "@servo/*/*/*/session",
        "nobody (schema 1 clients learn the versions spoken)",
        "answers a refusal only",
        stranger_refused=True,
    ),
    Door(
        "servo-serve",
        "queryable",
        "@servo/*/*/*/c/*/control",
        _SESSION,
        "sealed with the session key, sequence ids only move forward",
    ),
    Door(
        "servo-serve",
        "queryable",
        "@servo/*/*/*/trajectory",
        "robots replaying the server's library",
        "answers signed by the replica over the asker's nonce; the library is readable on the link",
        stranger_refused=False,
    ),
    Door(
        "servo-serve",
        "queryable",
        "@servo/*/*/*/audit",
        "monitors (the fleet's recent requests)",
        f"{_ROUTER_ACL}; operator admission: see the monitor's trust",
        stranger_refused=False,
    ),
    Door(
        "servo-serve",
        "subscriber",
        "@servo/*/*/*/c/*/obs",
        _SESSION,
        "the session MAC, epoch and sequence checked before decoding; per-session rate",
    ),
    Door(
        "servo-serve",
        "publisher",
        "@servo/*/*/*/c/*/action",
        _SESSION,
        "chunks, errors and notices sealed with the session key; keyless notices signed",
        stranger_refused=False,
    ),
    Door(
        "servo-serve",
        "liveliness subscriber",
        "@servo/*/*/*/c/*/alive",
        "robots announcing themselves",
        "a token only shortens a vanished robot's grace; never opens or closes a session by itself",
        stranger_refused=False,
    ),
    Door(
        "servo-serve",
        "liveliness token",
        "@servo/*/*/*/alive",
        "robots and monitors watching servers",
        "presence only; edges trust a replica by its identity, not its token",
        stranger_refused=False,
    ),
    # openpi door: its connections are sessions of the server on its own Zenoh session
    Door(
        "servo-serve",
        "subscriber",
        "@servo/*/*/*/c/*/action",
        "the openpi door's own sessions",
        "sealed with the session key",
        stranger_refused=False,
    ),
    Door(
        "servo-serve",
        "publisher",
        "@servo/*/*/*/c/*/obs",
        "the openpi door's own sessions",
        "sealed with the session key",
        stranger_refused=False,
    ),
    Door(
        "servo-serve",
        "liveliness token",
        "@servo/*/*/*/c/*/alive",
        "the openpi door's own sessions",
        "presence only",
        stranger_refused=False,
    ),
    Door(
        "servo-serve",
        "liveliness subscriber",
        "@servo/*/*/*/alive",
        "the openpi door's own sessions",
        "presence only",
        stranger_refused=False,
    ),
    # ---------------------------------------------------------------- servo-edge declarations
    Door(
        "servo-edge",
        "publisher",
        "@servo/*/*/*/c/*/obs",
        "the server holding its session",
        "sealed with the session key",
        stranger_refused=False,
    ),
    Door(
        "servo-edge",
        "subscriber",
        "@servo/*/*/*/c/*/action",
        "the server holding its session",
        "sealed chunks only (MAC, session, epoch, sequence, shape), signed keyless notices",
    ),
    Door(
        "servo-edge",
        "liveliness token",
        "@servo/*/*/*/c/*/alive",
        "its server",
        "presence only",
        stranger_refused=False,
    ),
    Door(
        "servo-edge",
        "liveliness subscriber",
        "@servo/*/*/*/alive",
        "servers announcing themselves",
        "a token only starts a re-handshake with a trusted identity; the known servers or the join token decide",
        stranger_refused=False,
    ),
    Door(
        "servo-edge",
        "publisher",
        "@servo/@robots/*/telemetry",
        "monitors",
        "signed by the robot's identity",
        stranger_refused=False,
    ),
    # ---------------------------------------------------------------- servo-monitor declarations
    Door(
        "servo-monitor",
        "subscriber",
        "@servo/@robots/*/telemetry",
        "robots reporting",
        "records signed by the robot's key (pinned with --robot-keys, else trusted on first use), replays refused",
        stranger_refused=False,
    ),
    Door(
        "servo-monitor",
        "liveliness subscriber",
        "@servo/*/*/*/alive",
        "servers announcing themselves",
        "presence only",
        stranger_refused=False,
    ),
)


def markdown_table() -> str:
    """The threat-model table of docs/guides/security.md (one row per door)."""
    lines = ["| program | door | where | who may use it | what stops anybody else |", "|---|---|---|---|---|"]
    lines += [f"| {d.component} | {d.kind} | `{d.where}` | {d.who} | {d.guard} |" for d in DOORS]
    return "\n".join(lines) + "\n"
