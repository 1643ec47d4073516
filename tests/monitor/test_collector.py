"""The monitor's Zenoh side believes only replicas it trusts: their signed status, their sealed audit answers.

Issue 29: a fake replica (``0-evil``) and forged audit rows and refusal events were shown. Now a
status counts only when signed, over this poll's nonce, by an identity the monitor trusts for
that replica, and an audit answer only when sealed to the monitor and signed by that replica.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
import pytest
import zenoh
from zenoh.handlers import Callback

from servo._core import ServerIdentity
from servo.identity import Identity
from servo.monitor import FleetView, RobotTrust
from servo.monitor.collector import FleetCollector
from servo.server.service import ServerReady
from servo.wire import AuditEntry, AuditTail, ServerKeys, StatusReply, encode, fingerprint, status_transcript
from tests.server.helpers import connected, observation, open_on
from tests.server.policies import FixedComputePolicy
from tests.support import client_settings, eventually, make_manifest, running_server

pytestmark = pytest.mark.anyio

OPERATOR = Identity.generate()


class Impostor:
    """Queryables a stranger declares: a fake replica ``0-evil`` answering status (signed by an identity
    of its own), and forged audit answers on the real replica's audit key."""

    def __init__(self, z: zenoh.Session, real: ServerReady) -> None:
        self._identity, self._real = ServerIdentity.generate(), real
        self.evil = ServerKeys(real.keys.app, real.keys.model, "0-evil")
        self.asked = 0
        self._entities = [
            z.declare_queryable(self.evil.status, Callback(self._status, indirect=False)),
            z.declare_queryable(real.keys.audit, Callback(self._audit, indirect=False)),
        ]

    def _status(self, query: zenoh.Query) -> None:
        with query:
            nonce = b"" if query.payload is None else query.payload.to_bytes()
            payload = encode(msgspec.structs.replace(self._real_status(), identity=self._identity.public_key))
            query.reply(self.evil.status, payload, attachment=self._identity.sign(status_transcript(nonce, payload)))

    def _real_status(self) -> StatusReply:
        return StatusReply(
            "evil", self.evil.app, self.evil.model, "0-evil", [3], self._real.info, True, False, 0, 8, 0.0, bytes(32)
        )

    def _audit(self, query: zenoh.Query) -> None:
        with query:
            self.asked += 1
            forged = AuditTail(
                self._real.keys.replica, [AuditEntry("robot-7", "ee" * 16, 99, 0, "forged", 0, 0, 0, 0, 0)]
            )
            query.reply(self._real.keys.audit, encode(forged))  # unsigned, in the clear

    def close(self) -> None:
        for entity in self._entities:
            entity.undeclare()


@asynccontextmanager
async def monitor(port: int, trusted: frozenset[bytes]) -> AsyncIterator[FleetCollector]:
    z = zenoh.open(client_settings(port).to_config())
    try:
        yield FleetCollector(FleetView(RobotTrust(servers=trusted), OPERATOR), z, OPERATOR)
    finally:
        z.close()


async def test_a_fake_replica_and_forged_audit_answers_are_never_shown(port: int) -> None:
    operators = f'[security]\noperators = [{{name = "ops", identity = "{fingerprint(OPERATOR.public_key)}"}}]\n'
    async with (
        running_server(make_manifest(port, extra=operators), FixedComputePolicy(compute_ms=1)) as (server, ready),
        connected(port, "robot-7") as robot,
        monitor(port, frozenset({server.state.replica.identity.public_key})) as collector,
    ):
        session = await open_on(robot, ready)
        await session.infer(*observation(1), timeout=5)
        await session.close()
        impostor = Impostor(collector.zsession, ready)
        try:
            await collector.poll_status()
            assert [r["replica"] for r in collector.view.snapshot()["replicas"]] == [ready.keys.replica]
            assert collector.view.refused.get("unverified", 0) >= 1  # 0-evil, counted, shown nowhere
            rows = await collector.requests("robot-7")
            assert impostor.asked >= 1  # the forger answered the monitor's query...
            assert [(row["seq"], row["outcome"]) for row in rows] == [(1, "ok")]  # ...and was not believed
            await collector.poll_refusals()
            assert not [e for e in collector.view.events if "forged" in e["text"]]
        finally:
            impostor.close()


async def test_an_untrusted_replica_is_not_shown(port: int) -> None:
    async with (
        running_server(make_manifest(port), FixedComputePolicy(compute_ms=1)),
        monitor(port, frozenset({ServerIdentity.generate().public_key})) as collector,
    ):
        await collector.poll_status()
        await eventually(lambda: collector.view.refused.get("unverified", 0) >= 1, what="the status refused")
        assert collector.view.snapshot()["replicas"] == []
