"""The edge survives any message: rejected before the queue, counted, the request retried.

Issue 8: a 3-column chunk for a 6-joint arm killed the engine (DEAD, exit 3); a NaN chunk
stopped the control loop with the arm not parked. A forger can no longer get a chunk past the
MAC, so these come from a *key holder*: a replica that completes a genuine handshake under its
own identity (an edge that pins nobody trusts it) and then sends hostile chunks, as a buggy or
compromised server would.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from servo._core import MSG_ERROR
from servo.client import PolicyClient
from servo.wire import ErrorEvent, ServerKeys, encode
from tests.security.peers import (
    SIM,
    ChunkForger,
    RogueReplica,
    Tap,
    closing,
    edge_rig,
    host_settings,
    peer_settings,
    sim_policy_spec,
)
from tests.server.policies import FixedComputePolicy
from tests.support import eventually, make_manifest, running_server

pytestmark = pytest.mark.anyio

DIM = len(SIM.joint_names)
GOOD = np.tile(np.asarray(SIM.rest_pose, np.float32), (20, 1))
NAN = GOOD.copy()
NAN[3, 2] = np.nan
INF = GOOD.copy()
INF[0, 0] = np.inf

#: What the hostile server answers, round robin (every other request gets a good chunk).
HOSTILE: dict[str, tuple[np.ndarray | bytes, str]] = {
    "3 columns for a 6-joint arm": (GOOD[:, :3].copy(), "shape"),
    "NaN": (NAN, "non_finite"),
    "inf": (INF, "non_finite"),
    "float64": (GOOD.astype(np.float64), "dtype"),
    "one row of one dimension": (GOOD[0].copy(), "shape"),
    "5000 steps (the edge takes 1024 at most)": (np.zeros((5000, DIM), np.float32), "shape"),
    "no steps": (np.zeros((0, DIM), np.float32), "shape"),
    "not msgpack": (b"\xc1\xc1not a chunk", "undecodable"),
}


def script(seq: int) -> np.ndarray | bytes:
    """Every fourth request gets a good chunk, the others each kind of hostile one in turn."""
    if seq % 4 == 0:
        return GOOD
    return list(HOSTILE.values())[(seq - 1 - seq // 4) % len(HOSTILE)][0]


async def test_hostile_chunks_from_a_key_holder_never_reach_the_queue(port: int, tmp_path: Path) -> None:
    async with PolicyClient.connect(host_settings(port)) as host:
        hostile = RogueReplica(host.zsession, ServerKeys("lab", "act", "hostile"), chunks=script)
        with closing(hostile):
            async with edge_rig(port, tmp_path, request_timeout_s=2.0) as rig:
                await eventually(
                    lambda: sum(rig.engine.statistics().chunks_rejected.values()) >= len(HOSTILE), 30, "every kind"
                )
                good_so_far = rig.engine.chunks_received
                await eventually(lambda: rig.engine.chunks_received >= good_so_far + 2, 10, "still streaming")
    summary = rig.summary
    assert summary.final_state == "streaming"
    assert summary.parked
    rejected = summary.chunks_rejected
    for reason in {reason for _, reason in HOSTILE.values()}:
        assert rejected[reason] >= 1, (reason, rejected)
    assert rejected["mac"] == 0  # every one of them was authentic: the checks behind the MAC caught them
    assert summary.errors >= len(HOSTILE)  # each refused chunk failed its request, retried at once
    assert summary.chunks_received >= 2
    for merge in rig.merges.merges:
        assert merge.chunk_robot.shape == (20, DIM)
        assert np.isfinite(merge.chunk_robot).all()
    frames = rig.recording().frames
    assert all(np.isfinite(np.frombuffer(f.action.data, "<f4")).all() for f in frames if f.action is not None)


async def test_an_out_of_order_chunk_is_never_merged(port: int, tmp_path: Path) -> None:
    """A key holder answering with another request's seq id: stale, dropped, the request times out and retries."""
    async with PolicyClient.connect(host_settings(port)) as host:
        hostile = RogueReplica(
            host.zsession,
            ServerKeys("lab", "act", "hostile"),
            chunks=lambda seq: GOOD,
            reply_seq=lambda seq: seq if seq % 3 else seq - 1,
        )
        with closing(hostile):
            async with edge_rig(port, tmp_path, request_timeout_s=0.5, timeout_streak=100) as rig:
                await eventually(lambda: rig.engine.statistics().chunks_rejected["stale_seq"] >= 2, 15, "stale")
                await eventually(lambda: rig.engine.chunks_received >= 4, 10, "streaming")
    assert rig.summary.final_state == "streaming"
    assert sorted(m.seq_id for m in rig.merges.merges if m.seq_id % 3 == 0) == []


async def test_only_a_notice_signed_by_the_replica_causes_a_re_handshake(port: int, tmp_path: Path) -> None:
    """A keyless ``unknown_session`` notice echoing the request in flight used to re-open the
    session: a sniffer could force handshakes until the robot hit its own open limit. Now it must
    be signed by the replica's identity: forged ones cost nothing (dropped, counted), and the
    server's own notice, when it really no longer knows the session, still re-opens at once."""
    policy = FixedComputePolicy(compute_ms=30, **sim_policy_spec(chunk_size=20))
    notice = encode(ErrorEvent("unknown_session", "forged"))
    async with (
        running_server(make_manifest(port), policy) as (server, _),
        PolicyClient.connect(peer_settings(port), "mallory") as mallory,
    ):
        z = mallory.zsession
        sniffer = Tap(z, "@servo/*/*/*/c/robot-7/obs")
        with closing(sniffer):
            async with edge_rig(port, tmp_path) as rig:
                await eventually(lambda: rig.engine.chunks_received >= 2, 15, "streaming")
                seen = sniffer.wait_for(lambda s: s.header is not None)
                first = rig.engine.session
                stats = rig.engine.statistics
                # Answering the next observations at once: each notice echoes the request in flight.
                forger = ChunkForger(z, seen.key, body=notice, msg_type=MSG_ERROR, limit=3)
                with closing(forger):
                    await eventually(lambda: stats().chunks_rejected["mac"] >= 3, 10, "three forged notices")
                received = rig.engine.chunks_received
                await eventually(lambda: rig.engine.chunks_received >= received + 2, 10, "streaming on")
                assert rig.engine.session is first  # no re-handshake
                (session,) = server.registry.snapshot()
                server.state.collect(session, "closed")  # the server forgets it, as after a restart
                await eventually(lambda: rig.engine.session not in (first, None), 10, "re-open")
                received = rig.engine.chunks_received
                await eventually(lambda: rig.engine.chunks_received >= received + 2, 10, "streaming again")
    assert rig.summary.final_state == "streaming"
    assert rig.engine.client is not None
    assert rig.engine.client.statistics().unknown_session_hints == 1  # the server's own notice only
    assert len(server.registry.snapshot()) == 0  # drained
