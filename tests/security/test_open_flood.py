"""A flood of fresh robots cannot lock out a robot that already used the server.

Issue 18: 150 session opens a second under fresh client ids exhausted the server's global open
budget, and the legitimate edge, reconnecting, gave up (exit 1). Every open is now signed by a
robot identity; without enrolment, identities that already streamed on the replica have an open
budget of their own, apart from never-seen ones, and a full replica makes room for them by closing
a session that never streamed (`servo.server.robots`). The flood here is every bit as valid as a
new robot: fresh client ids, fresh identities, genuine signatures, current nonces, 200 a second,
from another process.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.edge.harness import Proc
from tests.security.peers import edge_rig, sim_policy_spec
from tests.server.helpers import metric
from tests.server.policies import FixedComputePolicy
from tests.support import eventually, make_manifest, running_server

pytestmark = pytest.mark.anyio

#: The edge's per-request watchdog in the rig (`tests.edge.harness.edge_config` leaves the default).
REQUEST_TIMEOUT_S = 5.0
RATE = 200


async def test_a_flood_of_fresh_robots_does_not_lock_out_a_returning_one(port: int, tmp_path: Path) -> None:
    policy = FixedComputePolicy(compute_ms=5, **sim_policy_spec(chunk_size=20))
    async with running_server(make_manifest(port), policy) as (server, ready), edge_rig(port, tmp_path) as rig:
        await eventually(lambda: rig.engine.chunks_received >= 3, 15, "streaming")
        flood = Proc(
            [
                sys.executable,
                "-m",
                "tests.security.open_flood",
                "--port",
                str(port),
                "--prefix",
                ready.keys.prefix,
                "--rate",
                str(RATE),
            ]
        )
        try:
            flood.wait_line("FLOODING", 30)
            await eventually(
                lambda: metric(server, "servo_sessions_rejected_total", code="rate_limited") >= 20,
                30,
                "the flood past the budget of new robots",
            )
            await server.wait_sessions(lambda sessions: len(sessions) == server.state.replica.max_sessions)
            attack_started = time.monotonic_ns()
            for _ in range(3):  # the server drops the robot's session: it must get back in now
                session = server.registry.by_client("robot-7")
                assert session is not None
                server.state.collect(session, "idle")
                await eventually(
                    lambda gone=session.session_id: (
                        getattr(server.registry.by_client("robot-7"), "session_id", gone) != gone
                    ),
                    REQUEST_TIMEOUT_S,
                    "robot-7 back in",
                )
                received = rig.engine.chunks_received
                await eventually(lambda n=received: rig.engine.chunks_received >= n + 2, 15, "streaming again")
            attack_ended = time.monotonic_ns()
        finally:
            flood.stop()
    assert any(line.startswith("SENT ") for line in flood.lines)
    assert rig.summary.final_state == "streaming"
    assert rig.merges.longest_gap_s(attack_started, attack_ended) < REQUEST_TIMEOUT_S
    # The server was full of strangers: robot-7 took a slot from one that never streamed.
    assert metric(server, "servo_sessions_collected_total", reason="displaced") >= 1
