"""Finding replicas: ask every status queryable, keep the usable ones, rank them.

Discovery skips replicas whose status does not decode, is inconsistent or names an untrusted
identity: one the pins refuse (`servo.client.trust`) or, without pins, one the known-servers file
does not hold for the deployment (`servo.client.known`, `first_use`). The rest are ranked by
`placement_score`, least loaded first.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import zenoh

from servo.client.errors import NoServerFound, UntrustedServer
from servo.client.known import KnownServers, accept_command, deployment
from servo.client.trust import TrustedServers
from servo.client.verify import ClientCounters
from servo.logs import get_logger
from servo.transport import query
from servo.wire import MAX_STATUS_BYTES, ServerKeys, StatusReply, WireError, decode, fingerprint, status_selector
from servo.wire.keys import on_this_host

log = get_logger(__name__)

#: Recent queue wait that weighs as much as a full replica in the placement score (ms).
QUEUE_WAIT_FULL_MS = 1000.0
#: Placement scores this close to the best are equally good (`first_choice` draws among them).
PLACEMENT_TIE = 0.05


@dataclass(frozen=True)
class ServerInfo:
    """One replica as discovered: its keys and its status."""

    keys: ServerKeys
    status: StatusReply

    @property
    def local(self) -> bool:
        """The replica runs on this machine (its ``server_id`` names this host: `host_server_id`).

        Its link is shared memory or loopback: what the codec choice needs to know
        (`servo.client.codec`). Only that choice reads it.
        """
        return on_this_host(self.status.server_id)


def placement_score(status: StatusReply) -> float:
    """Lower is better: the share of capacity in use plus the recent queue wait.

    Computed from validated fields only (`StatusReply` refuses impossible values), and from the
    session count rather than the advertised ``load``, which the count already bounds.
    """
    return status.active_sessions / status.max_sessions + status.queue_wait_ms / QUEUE_WAIT_FULL_MS


async def discover(
    zsession: zenoh.Session,
    trusted: TrustedServers,
    counters: ClientCounters,
    *,
    app: str | None,
    model: str | None,
    timeout: float,
    known: KnownServers | None = None,
) -> list[ServerInfo]:
    """Ask every replica for its status; returns the usable ones, least-loaded first.

    A reply that does not decode (or advertises an impossible load) is skipped with a
    rate-limited warning; one that names another replica than its key, or an identity
    ``trusted`` refuses, is skipped and counted as rogue. Neither is ever fatal. Without pins,
    ``known`` decides which identities are trusted (`first_use`).

    Raises:
        UntrustedServer: replicas answered, but none with an identity trusted for the deployment.
        NoServerFound: nobody usable answered.
    """
    started = time.monotonic()
    replies = await query(zsession, status_selector(app, model), timeout=timeout)
    waited = time.monotonic() - started
    servers = []
    for reply in replies:
        if reply.ok is None:
            continue
        try:
            status = decode(reply.ok.payload.to_bytes(), StatusReply, max_bytes=MAX_STATUS_BYTES)
            keys = ServerKeys.parse_status(str(reply.ok.key_expr))
        except WireError as exc:
            counters.undecodable(str(exc))
            continue
        problem = trusted.check_status(keys, status)
        if problem is not None:
            counters.rogue(keys.replica, problem)
            continue
        servers.append(ServerInfo(keys, status))
    if servers and known is not None and not trusted.pinned:
        servers = first_use(servers, known, deployment(app, model), counters)
    if not servers:
        where = status_selector(app, model)
        # Zenoh ends a query at once when no queryable matches: say so instead of a timeout.
        why = f"within {timeout:g} s" if waited >= timeout else "(none is reachable)"
        raise NoServerFound(f"no servo server answered on {where} {why}")
    return sorted(servers, key=lambda s: (s.status.draining, placement_score(s.status), s.keys.replica))


def first_choice(servers: list[ServerInfo], *, recent: bool = True) -> list[ServerInfo]:
    """``servers`` in the order to try them: the first drawn among the best, the rest as they were.

    The best are the live replicas whose `placement_score` is within `PLACEMENT_TIE` of the
    lowest: robots placing themselves at once on the same view of the fleet (a failover) spread
    over equally good replicas instead of all picking the one a session emptier. A view kept
    from an earlier discovery (``recent=False``: a failover to the replicas known) says nothing of
    their load now: its session counts and queue waits are those of one past moment, often the
    same for robots that started together (weighed, they sent 68 robots of a killed replica to one
    survivor and 33 to the other), so the first is drawn among every live replica and settling
    (`servo.client.settle`) evens out what chance left uneven.
    """
    live = [s for s in servers if not s.status.draining]
    if len(live) < 2:
        return servers
    if recent:
        best = min(placement_score(s.status) for s in live)
        live = [s for s in live if placement_score(s.status) <= best + PLACEMENT_TIE]
    first = random.choice(live)
    return [first, *(s for s in servers if s is not first)]


def first_use(
    servers: list[ServerInfo], known: KnownServers, selector: str, counters: ClientCounters
) -> list[ServerInfo]:
    """The replicas whose identity ``known`` trusts for ``selector``; at first contact, all of them.

    First contact (nothing known for ``selector``) trusts the one identity that answered and
    writes it down; several identities are refused, listed. Later, a replica advertising an
    identity not written down is skipped, counted and logged as an error naming both identities
    and the command that accepts the new one.

    Raises:
        UntrustedServer: several identities at first contact, or none of the known ones later.
    """
    trusted = known.identities(selector)
    seen = {server.status.identity for server in servers}
    if not trusted:
        if len(seen) > 1:
            holders = {i: ", ".join(s.keys.replica for s in servers if s.status.identity == i) for i in seen}
            listed = "; ".join(f"{fingerprint(identity)} ({holders[identity]})" for identity in sorted(seen))
            raise UntrustedServer(
                f"first contact with {selector}: {len(seen)} server identities answered ({listed}), so nothing "
                f"is trusted (one may be an impostor); trust the right one with: {accept_command(selector, seen)} "
                "(keep only yours), or pin it with --trusted-servers"
            )
        known.replace(selector, seen)
        log.info("server trusted on first use", deployment=selector, identity=fingerprint(next(iter(seen))))
        return servers
    was = ", ".join(fingerprint(identity) for identity in sorted(trusted))
    usable = []
    for server in servers:
        if server.status.identity in trusted:
            usable.append(server)
            continue
        now = fingerprint(server.status.identity)
        counters.untrusted(
            server.keys.replica,
            f"{selector} is trusted as {was} ({known.path}), replica {server.keys.replica} is {now}; if the server "
            f"was re-keyed on purpose: {accept_command(selector, [server.status.identity])}",
        )
    if not usable:
        news = sorted(seen)
        raise UntrustedServer(
            f"no replica of {selector} has the identity trusted for it: known {was} ({known.path}), now "
            f"{', '.join(fingerprint(identity) for identity in news)}; if the server was re-keyed on purpose, "
            f"accept it with: {accept_command(selector, news)} (or pin it with --trusted-servers)"
        )
    return usable
