"""A replica's audit trail: operators read the fleet's, a robot its own, a stranger nothing.

Issue 29: any Zenoh peer could query a replica's ``…/audit`` and read another robot's last
requests, on plain and TLS links, and a stranger erased a robot's audit history by cycling 1,100
throw-away robots through it. Now the query is signed by an operator's or the robot's identity
(over a fresh status nonce) and the answer sealed to the asker's ephemeral key; enrolled robots'
rows are never displaced by anybody else's.
"""

from __future__ import annotations

import msgspec
import pytest

from servo.client import PolicyClient, ServerError
from servo.client.audit import ask_audit
from servo.client.discovery import ServerInfo
from servo.identity import Identity
from servo.server.audit import RecentRequests
from servo.transport import query
from servo.wire import AuditEntry, AuditQuery, AuditTail, WireError, decode, encode, fingerprint
from tests.security.peers import peer_settings
from tests.server.helpers import connected, observation, open_on
from tests.server.policies import FixedComputePolicy
from tests.support import make_manifest, running_server

pytestmark = pytest.mark.anyio

OPERATOR = Identity.generate()


def operators_manifest(port: int) -> str:
    return f'[security]\noperators = [{{name = "ops", identity = "{fingerprint(OPERATOR.public_key)}"}}]\n'


async def served(client: PolicyClient, ready: object, requests: int) -> None:
    session = await open_on(client, ready)  # type: ignore[arg-type]
    for value in range(requests):
        await session.infer(*observation(value), timeout=5)
    await session.close()


async def replica(client: PolicyClient, ready: object) -> ServerInfo:
    (server,) = [s for s in await client.discover() if s.keys == ready.keys]  # type: ignore[attr-defined]
    return server


async def test_operators_read_the_fleet_robots_their_own_rows_and_strangers_nothing(port: int) -> None:
    manifest = make_manifest(port, extra=operators_manifest(port))
    async with (
        running_server(manifest, FixedComputePolicy(compute_ms=1)) as (_, ready),
        connected(port, "robot-7") as robot,
        connected(port, "robot-8", identity=Identity.generate()) as other,
        PolicyClient.connect(peer_settings(port), "stranger", identity=Identity.generate()) as stranger,
    ):
        await served(robot, ready, 3)
        await served(other, ready, 2)
        server = await replica(stranger, ready)
        z, keys = stranger.zsession, ready.keys

        # A stranger's query, unsigned as on main or signed by its own identity: nothing.
        for reply in await query(z, keys.audit, payload=encode(AuditQuery()), timeout=2):
            assert reply.ok is None
            assert b"robot-7" not in reply.err.payload.to_bytes()  # type: ignore[union-attr]
        with pytest.raises(ServerError) as info:
            await ask_audit(z, keys, server.status, stranger.identity, AuditQuery(), timeout=2)
        assert info.value.code == "unauthenticated"
        assert "is no operator of this replica" in info.value.message

        # The operator reads the fleet; each robot only what its own key made.
        fleet = await ask_audit(z, keys, server.status, OPERATOR, AuditQuery(), timeout=2)
        assert sorted({e.client_id for e in fleet.entries}) == ["robot-7", "robot-8"]
        own = await ask_audit(robot.zsession, keys, server.status, robot.identity, AuditQuery("robot-7"), timeout=2)
        assert [e.seq_id for e in own.entries] == [1, 2, 3]
        for asked in (AuditQuery("robot-8"), AuditQuery()):
            with pytest.raises(ServerError, match="no operator of this replica, nor a robot it admits"):
                await ask_audit(robot.zsession, keys, server.status, robot.identity, asked, timeout=2)


async def test_a_captured_audit_query_replayed_reads_nothing(port: int) -> None:
    manifest = make_manifest(port, extra=operators_manifest(port))
    async with (
        running_server(manifest, FixedComputePolicy(compute_ms=1)) as (_, ready),
        connected(port, "robot-7") as robot,
        PolicyClient.connect(peer_settings(port), "stranger", identity=Identity.generate()) as stranger,
    ):
        await served(robot, ready, 2)
        server = await replica(stranger, ready)
        captured: list[bytes] = []
        tap = stranger.zsession.declare_queryable(
            ready.keys.audit, lambda q: captured.append(b"" if q.payload is None else q.payload.to_bytes())
        )
        try:
            await ask_audit(robot.zsession, ready.keys, server.status, OPERATOR, AuditQuery(), timeout=2)
        finally:
            tap.undeclare()
        assert captured  # the stranger's own queryable received the operator's query
        for reply in await query(stranger.zsession, ready.keys.audit, payload=captured[0], timeout=2):
            assert reply.ok is not None  # the replica answers a replay of a fresh, signed query...
            with pytest.raises(WireError):
                decode(reply.ok.payload.to_bytes(), AuditTail)  # ...sealed to the operator's key
            assert b"robot-7" not in reply.ok.payload.to_bytes()


def entry(client: str, seq: int) -> AuditEntry:
    return AuditEntry(client, "00" * 16, seq, 0, "ok", 1.0, 2.0, 3.0, 0, 0.0)


def test_throw_away_robots_cannot_erase_an_enrolled_robots_history() -> None:
    recent = RecentRequests()
    key = Identity.generate().public_key
    for seq in range(1, 101):
        recent.add(entry("robot-7", seq), robot_key=key, enrolled=True)
    for i in range(1100):  # each a new identity under a new name, one request each
        recent.add(entry(f"throwaway-{i}", 1), robot_key=i.to_bytes(32, "little"))
    rows = recent.tail(msgspec.structs.replace(AuditQuery("robot-7"), limit=512))
    assert [e.seq_id for e in rows] == list(range(1, 101))
    assert recent.tail(AuditQuery("throwaway-0")) == []  # the flood only displaced its own kind
    assert recent.robot_keys("robot-7") == {key}
