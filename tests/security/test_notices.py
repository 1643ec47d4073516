"""A burst of forged notices costs a robot nothing: no re-handshake, no gap, every one counted.

Issue 18: anyone who can publish on a robot's action key echoed keyless ``unknown_session``
notices for the request in flight; each one made the edge re-handshake, ~20 of them until the
robot hit its own open-rate limit, and it went 6.8 s and 7.6 s without a fresh action. Notices a
replica cannot seal are now signed by its identity for that replica and that request
(`servo.server.notices`); the edge drops the rest.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from servo.client import PolicyClient
from servo.server.service import PolicyServer, ServerReady
from tests.security.notice_peers import NoticeForger, NoticeOracle
from tests.security.peers import (
    EdgeRig,
    closing,
    edge_rig,
    peer_settings,
    sim_policy_spec,
)
from tests.server.policies import FixedComputePolicy
from tests.support import eventually, make_manifest, running_server

pytestmark = pytest.mark.anyio

OBS = "@servo/*/*/*/c/robot-7/obs"
#: The edge's per-request watchdog in the rig (`tests.edge.harness.edge_config` leaves the default).
REQUEST_TIMEOUT_S = 5.0


@asynccontextmanager
async def robot7_streaming(
    port: int, tmp_path: Path
) -> AsyncIterator[tuple[PolicyServer, ServerReady, PolicyClient, EdgeRig]]:
    """A real server, robot-7's edge streaming from it, and mallory on the same network."""
    # 30 ms per request: forged notices reach the edge long before each real chunk.
    policy = FixedComputePolicy(compute_ms=30, **sim_policy_spec(chunk_size=20))
    async with (
        running_server(make_manifest(port), policy) as (server, ready),
        PolicyClient.connect(peer_settings(port), "mallory") as mallory,
        edge_rig(port, tmp_path) as rig,
    ):
        await eventually(lambda: rig.engine.chunks_received >= 3, 15, "streaming")
        yield server, ready, mallory, rig


async def test_a_burst_of_forged_notices_forces_no_re_handshake(port: int, tmp_path: Path) -> None:
    async with robot7_streaming(port, tmp_path) as (server, _, mallory, rig):
        first = rig.engine.session
        assert first is not None
        stats = rig.engine.statistics
        forger = NoticeForger(mallory.zsession, OBS, repeat=4)
        with closing(forger):
            attack_started = time.monotonic_ns()
            received = rig.engine.chunks_received
            await eventually(lambda: forger.forged >= 40, 20, "a burst of forged notices")
            await eventually(lambda: rig.engine.chunks_received >= received + 8, 20, "streaming through it")
            attack_ended = time.monotonic_ns()
        assert rig.engine.session is first  # the same session all along: not one re-handshake
        (session,) = server.registry.snapshot()
        assert session.session_id == first.session_id
    assert rig.engine.client is not None
    assert rig.engine.client.statistics().unknown_session_hints == 0
    assert stats().chunks_rejected["mac"] >= 20  # the forgeries that reached the edge, each counted
    assert rig.summary.final_state == "streaming"
    assert rig.merges.longest_gap_s(attack_started, attack_ended) < REQUEST_TIMEOUT_S
    assert {m.session_id for m in rig.merges.merges} == {first.session_id}


async def test_a_notice_the_replica_signed_for_another_client_forces_no_re_handshake(port: int, tmp_path: Path) -> None:
    # Found re-verifying issue 18: the replica signed its notice over its prefix and the header
    # it answered, not the client it answered, so a sniffer re-published robot-7's observations
    # under fresh client ids and forwarded the genuine notices: 38 re-handshakes in 20 s, the
    # robot's open budget spent, 5.5 s without a fresh action.
    async with robot7_streaming(port, tmp_path) as (server, ready, mallory, rig):
        first = rig.engine.session
        assert first is not None
        oracle = NoticeOracle(mallory.zsession, ready.keys.prefix, "robot-7")
        with closing(oracle):
            attack_started = time.monotonic_ns()
            await eventually(lambda: oracle.forwarded >= 10, 20, "genuine notices forwarded to robot-7")
            received = rig.engine.chunks_received
            await eventually(lambda: rig.engine.chunks_received >= received + 5, 20, "streaming through it")
            attack_ended = time.monotonic_ns()
        assert rig.engine.session is first  # not one re-handshake
        (session,) = server.registry.snapshot()  # the oracle's client ids hold no session
        assert session.session_id == first.session_id
    assert rig.engine.client is not None
    assert rig.engine.client.statistics().unknown_session_hints == 0
    assert rig.summary.final_state == "streaming"
    assert rig.merges.longest_gap_s(attack_started, attack_ended) < REQUEST_TIMEOUT_S
