"""Per-robot metrics with bounded labels, the staleness of answers, and the monitors' audit queryable."""

from __future__ import annotations

import anyio
import pytest

from servo.client import ServerError
from servo.client.audit import ask_audit
from servo.identity import Identity
from servo.transport import query
from servo.wire import AuditQuery, AuditTail, Rejection, decode, fingerprint
from tests.server.helpers import connected, metric, observation, open_on, sealed, server_manifest
from tests.server.policies import FixedComputePolicy
from tests.support import eventually, keep_sending, running_server

pytestmark = pytest.mark.anyio


async def test_a_robot_has_series_of_its_own_only_while_its_session_lives(port: int) -> None:
    manifest = server_manifest(port, serving="max_sessions = 4", ops="health_port = 0\nrobot_metrics = 1")
    async with running_server(manifest, policy=FixedComputePolicy(compute_ms=5)) as (server, ready):
        robots = server.metrics.robots
        async with connected(port, "robot-a") as a, connected(port, "robot-b") as b:
            first, second = await open_on(a, ready), await open_on(b, ready)
            assert robots.labelled == ["robot-a"]  # the cap: robot-b counts as "other"
            for i in range(3):
                await first.infer(*observation(i), timeout=5)
            await second.infer(*observation(7), timeout=5)
            await eventually(lambda: metric(server, "servo_robot_staleness_ms_count", robot="other") == 1)
            await eventually(lambda: metric(server, "servo_robot_requests_total", robot="robot-a", outcome="ok") == 3)
            assert metric(server, "servo_robot_queue_wait_ms_count", robot="robot-a") == 3
            assert metric(server, "servo_robot_inference_ms_count", robot="robot-a") == 3
            # The answer left after the forward: staleness covers at least the inference.
            assert metric(server, "servo_robot_staleness_ms_sum", robot="robot-a") >= 3 * 5
            assert metric(server, "servo_robot_requests_total", robot="robot-b", outcome="ok") == 0

            # An observation under robot-a's key that fails authentication counts for robot-a.
            # (Sent until counted: a peer's put may be dropped by its congestion control at load.)
            attachment, _ = sealed(first, 99, b"other")
            await keep_sending(
                lambda: a.zsession.put(ready.keys.client("robot-a").obs, b"x" * 64, attachment=attachment),
                lambda: metric(server, "servo_robot_observations_rejected_total", robot="robot-a", reason="mac") >= 1,
            )
            # A client id without a session never becomes a label.
            await keep_sending(
                lambda: a.zsession.put(ready.keys.client("ghost-1").obs, b"x", attachment=bytes(62)),
                lambda: metric(server, "servo_robot_observations_rejected_total", robot="other", reason="header") >= 1,
            )
            assert "ghost-1" not in server.metrics.render().decode()

            await first.close()
            await eventually(lambda: robots.labelled == [], what="robot-a's label removed")
            text = server.metrics.render().decode()
            assert 'robot="robot-a"' not in text
            assert 'robot="other"' in text
            assert metric(server, "servo_chunk_duration_ms") == pytest.approx(
                1e3 * ready.info.chunk_size / ready.info.fps
            )
            await second.close()


async def test_monitors_read_a_replicas_recent_requests(port: int) -> None:
    operator = Identity.generate()
    manifest = server_manifest(
        port, extra=f'[security]\noperators = [{{name = "ops", identity = "{fingerprint(operator.public_key)}"}}]'
    )
    async with (
        running_server(manifest, policy=FixedComputePolicy(compute_ms=5)) as (_, ready),
        connected(port, "robot-a") as a,
        connected(port, "robot-b") as b,
    ):
        session = await open_on(a, ready)
        other = await open_on(b, ready)
        for i in range(3):
            await session.infer(*observation(i), timeout=5)
        await other.infer(*observation(1), timeout=5)
        with pytest.raises(ServerError, match="bad_observation"):
            await other.infer(*observation(1, dim=3), timeout=5)

        (server,) = [s for s in await a.discover() if s.keys == ready.keys]

        async def ask(request: AuditQuery | None) -> AuditTail:
            asked = AuditQuery() if request is None else request
            return await ask_audit(a.zsession, ready.keys, server.status, operator, asked, timeout=5)

        tail = await ask(AuditQuery("robot-a"))
        assert tail.replica == ready.keys.replica
        assert [(e.seq_id, e.outcome, e.session_id) for e in tail.entries] == [
            (seq, "ok", session.session_id) for seq in (1, 2, 3)
        ]
        assert all(e.staleness_ms >= e.inference_ms >= 5 for e in tail.entries)
        ages = [e.age_ms for e in tail.entries]
        assert ages == sorted(ages, reverse=True)  # oldest first, ages on the server's clock
        assert ages[-1] >= 0
        everything = await ask(None)
        assert {e.client_id for e in everything.entries} == {"robot-a", "robot-b"}
        errors = await ask(AuditQuery(errors_only=True))
        assert [(e.client_id, e.outcome) for e in errors.entries] == [("robot-b", "bad_observation")]
        assert [e.seq_id for e in (await ask(AuditQuery("robot-a", limit=1))).entries] == [3]

        (bad,) = await query(a.zsession, ready.keys.audit, payload=b"\xc1", timeout=5)
        assert bad.err is not None
        assert decode(bad.err.payload.to_bytes(), Rejection).code == "bad_request"
        with anyio.fail_after(5):
            await session.close()
            await other.close()
