"""Every door servo opens: each listening socket, Zenoh declaration and file, who may use it, what guards it.

The one source of truth of the threat-model table in docs/guides/security.md (`markdown_table`
renders it; a test checks the page holds exactly that), and of the exposure census (``tests/security/test_census.py``),
which starts a server (loopback and ``tls/0.0.0.0``), an edge, a router, a monitor and the openpi
door, lists every socket they listen on, every key expression they declare and every file they
keep in servo's directory, and fails on one this table does not name, or on a stranger's
unauthenticated use that succeeds where a row says it is refused.

Key expressions use ``*`` for one chunk: ``@servo/<app>/<model>/<replica>/…``, clients under
``c/<client id>``, telemetry under ``@servo/@robots/<client id>``. Files are named relative to
servo's directory (`servo.home`), ``<…>`` for one path segment, or by the setting that places
them elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["DOORS", "Door", "markdown_table"]

Kind = Literal["socket", "queryable", "subscriber", "publisher", "liveliness token", "liveliness subscriber", "file"]
Component = Literal["servo-serve", "servo-edge", "servo-router", "servo-monitor"]


@dataclass(frozen=True)
class Door:
    """One row of the threat model.

    Args:
        component: The program that opens it (the openpi door is part of ``servo-serve``).
        kind: A listening socket, a Zenoh declaration or a file.
        where: For a socket, the setting that chooses it; for a declaration, its key expression;
            for a file, its path in servo's directory.
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
_OWNER = "this user only"
_PRIVATE = "mode 0600 in a 0700 directory, no link followed, owner checked, replaced atomically"

DOORS: tuple[Door, ...] = (
    # ---------------------------------------------------------------- listening sockets
    Door(
        "servo-serve",
        "socket",
        "zenoh.listen (tcp/127.0.0.1:7447; beside a tls/ one, quic/ on its port, UDP)",
        "this host's processes; off loopback: enrolled robots (join tokens), monitors",
        "plain text off loopback needs --insecure (TLS or QUIC otherwise, one certificate); off loopback only "
        "enrolled robots open sessions unless --allow-any-robot; every session message encrypted (AES-256-GCM)",
    ),
    Door(
        "servo-serve",
        "socket",
        "ops.health_host:ops.health_port (127.0.0.1:9100)",
        "this host (a scraper, the orchestrator's probe)",
        "off loopback needs --expose-health; GET only, bounded request, at most 64 connections at once",
        stranger_refused=False,
    ),
    Door(
        "servo-serve",
        "socket",
        "frontends.openpi.listen (127.0.0.1:8000)",
        "openpi clients on this host; off loopback: holders of an API key",
        "off loopback: wss unless --insecure, an API key (hashed in the roster) unless --allow-any-robot, "
        "per-key open budget, a revoked key's connections closed; a capacity of its own (max_connections)",
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
        "loopback by default; GET only, bounded request, at most 64 connections at once",
        stranger_refused=False,
    ),
    # ---------------------------------------------------------------- servo-serve declarations
    Door(
        "servo-serve",
        "queryable",
        "@servo/*/*/*/status",
        "anyone on the link (discovery)",
        "public by design: capabilities, load, identity, a nonce; no robot names; signed by the replica over "
        "the asker's nonce, at most [limits] status_queries_per_s for all askers together (beyond: dropped "
        "unread, unanswered)",
        stranger_refused=False,
    ),
    Door(
        "servo-serve",
        "queryable",
        "@servo/*/*/*/c/*/session",
        "enrolled robots (any robot on an open door)",
        "at most [limits] door_requests_per_s for everybody before it is read; signed by the robot's identity "
        "over a fresh nonce; enrolment or a join token's proof; budgets per key",
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
        "encrypted with the session key, sequence ids only move forward",
    ),
    Door(
        "servo-serve",
        "queryable",
        "@servo/*/*/*/trajectory",
        "enrolled robots replaying the server's library (any robot on an open door)",
        "budgets for everybody together, then per key, before it is read or anything signed (beyond: silence); "
        "signed by the robot's identity and admitted by the rule in force (a revoked robot at once); answers "
        "encrypted to the asker and signed by the replica over its nonce",
    ),
    Door(
        "servo-serve",
        "queryable",
        "@servo/*/*/*/audit",
        "operators (the fleet's recent requests), each robot (its own)",
        f"budgets for everybody together, then per key, before it is read (beyond: silence); signed by the asker "
        f"over a nonce the replica handed out; operators from [security] operators or the fleet's [[monitors]], "
        f"robots admitted by the rule in force (a revoked robot reads nothing); answers encrypted to the asker; "
        f"{_ROUTER_ACL}",
    ),
    Door(
        "servo-serve",
        "subscriber",
        "@servo/*/*/*/c/*/obs",
        _SESSION,
        "the session's AES-GCM tag, epoch and sequence checked before decoding; per-session rate",
    ),
    Door(
        "servo-serve",
        "publisher",
        "@servo/*/*/*/c/*/action",
        _SESSION,
        "chunks, errors and notices encrypted with the session key; keyless notices signed",
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
        "encrypted with the session key",
        stranger_refused=False,
    ),
    Door(
        "servo-serve",
        "publisher",
        "@servo/*/*/*/c/*/obs",
        "the openpi door's own sessions",
        "encrypted with the session key",
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
        "socket",
        "its quic/ dial beside a tls/ endpoint (an ephemeral UDP port; [link] prefer_quic)",
        "the server it dialled",
        "QUIC (TLS 1.3): the server's certificate checked as for tls/; datagrams of no connection it opened "
        "are dropped; where QUIC did not link, five probes from another port (at most 1 s) whose answers, from "
        "that address only, decide nothing but whether QUIC is dialled again",
    ),
    Door(
        "servo-edge",
        "publisher",
        "@servo/*/*/*/c/*/obs",
        "the server holding its session",
        "encrypted with the session key",
        stranger_refused=False,
    ),
    Door(
        "servo-edge",
        "subscriber",
        "@servo/*/*/*/c/*/action",
        "the server holding its session",
        "encrypted chunks only (AES-GCM tag, session, epoch, sequence, shape), signed keyless notices",
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
        "operators: those the replica's signed ack names, and telemetry_readers",
        "encrypted to those operators, signed by the robot's identity, runs counted across restarts",
        stranger_refused=False,
    ),
    # ---------------------------------------------------------------- servo-monitor declarations
    Door(
        "servo-monitor",
        "subscriber",
        "@servo/@robots/*/telemetry",
        "enrolled robots reporting",
        "robots' keys from their enrolment (--robot-keys, --fleet, a trusted replica's roster), never the first "
        "to speak; records signed by that key and decrypted with the monitor's identity, checks budgeted per "
        "robot and for the fleet; replays refused",
    ),
    Door(
        "servo-monitor",
        "liveliness subscriber",
        "@servo/*/*/*/alive",
        "servers announcing themselves",
        "presence only",
        stranger_refused=False,
    ),
    # ---------------------------------------------------------------- files in servo's directory
    Door("servo-serve", "file", "servers/<app>.key", _OWNER, f"the replica's identity: {_PRIVATE}"),
    Door(
        "servo-serve",
        "file",
        "servers/<app>.roster",
        _OWNER,
        f"robots joined, join tokens (verification keys), API keys (hashes): {_PRIVATE}",
    ),
    Door(
        "servo-serve",
        "file",
        "servers/<app>.roster.lock",
        _OWNER,
        "empty, the roster's lock: created 0600, no link followed",
    ),
    Door("servo-serve", "file", "tls/server.key", _OWNER, f"the self-signed certificate's key: {_PRIVATE}"),
    Door("servo-serve", "file", "tls/server.pem", _OWNER, f"the self-signed certificate: {_PRIVATE}"),
    Door("servo-edge", "file", "robot.key", _OWNER, f"the robot's identity: {_PRIVATE}"),
    Door("servo-edge", "file", "known_servers", _OWNER, f"servers trusted on first use: {_PRIVATE}"),
    Door("servo-edge", "file", "tls/pinned/<hash>.pem", _OWNER, f"certificates a join token pinned: {_PRIVATE}"),
    Door("servo-edge", "file", "telemetry.run", _OWNER, f"the run counter (replays of old runs): {_PRIVATE}"),
    Door("servo-monitor", "file", "monitor.key", _OWNER, f"the operator identity: {_PRIVATE}"),
    Door("servo-monitor", "file", "monitor.state", _OWNER, f"runs seen and keys trusted: {_PRIVATE}"),
    Door(
        "servo-serve",
        "socket",
        'model.process = "separate": the policy link',
        "the server and the policy process it started",
        "an anonymous socketpair the policy process inherits: no path, no port, nothing listens; "
        "the policy process holds no other socket; frames cross in the server's memfd (no name on "
        "any file system), which the policy process gets read-only over that socketpair and nobody but "
        "the server can write (sealed); the server takes no descriptor from the policy process",
    ),
    # ---------------------------------------------------------------- files where the operator says
    Door(
        "servo-serve",
        "file",
        "[ops] audit_log",
        _OWNER,
        "every robot's requests, one JSON line each: created 0600 (an existing file keeps its mode)",
    ),
    Door(
        "servo-edge",
        "file",
        "--record PATH",
        _OWNER,
        "what the robot saw (camera frames) and did: created 0600 (an existing file keeps its mode)",
    ),
    Door(
        "servo-edge",
        "file",
        "--display-save FILE.rrd",
        _OWNER,
        "the live view (camera frames, joints): created 0600 (an existing file keeps its mode)",
    ),
    Door(
        "servo-edge",
        "file",
        "--summary PATH",
        _OWNER,
        "the run's summary (why it stopped, faults, link figures): created 0600 (an existing file keeps its mode)",
    ),
)


def markdown_table() -> str:
    """The threat-model table of docs/guides/security.md (one row per door)."""
    lines = ["| program | door | where | who may use it | what stops anybody else |", "|---|---|---|---|---|"]
    lines += [f"| {d.component} | {d.kind} | `{d.where}` | {d.who} | {d.guard} |" for d in DOORS]
    return "\n".join(lines) + "\n"
