"""Forged and replayed chunks never reach the robot, even on a flat network with no router.

The attack of issue 8: a peer that answers a robot's observation before the server drove the
arm for ~9 s, and the recording logged those ticks as the real session's policy actions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest
import zenoh

from servo.client import PolicyClient
from tests.security.peers import ChunkForger, EdgeRig, Tap, closing, edge_rig, peer_settings, sim_policy_spec
from tests.server.policies import FixedComputePolicy
from tests.support import eventually, keep_sending, make_manifest, running_server

pytestmark = pytest.mark.anyio

FORGED = 12.345
OBS = "@servo/*/*/*/c/robot-7/obs"


async def test_a_forged_chunk_answering_first_is_never_executed(port: int, tmp_path: Path) -> None:
    # The server takes 30 ms per request: the forgers answer every observation long before it.
    policy = FixedComputePolicy(compute_ms=30, **sim_policy_spec(chunk_size=20))
    async with (
        running_server(make_manifest(port), policy) as (server, _),
        PolicyClient.connect(peer_settings(port), "mallory") as mallory,
    ):
        unsigned = ChunkForger(mallory.zsession, OBS, FORGED)
        guessed = ChunkForger(mallory.zsession, OBS, FORGED, secret=bytes(range(32)))
        with closing(unsigned, guessed):
            async with edge_rig(port, tmp_path) as rig:
                await eventually(lambda: rig.engine.chunks_received >= 5, 15, "streaming")
                await eventually(lambda: min(unsigned.forged, guessed.forged) >= 5, 15, "both forgers answering")
                assert rig.engine.session is not None
                real_session = rig.engine.session.session_id
                (served,) = server.registry.snapshot()
                assert served.session_id == real_session
    summary = rig.summary
    assert summary.final_state == "streaming"
    assert summary.chunks_rejected["mac"] >= 10  # both forgers, at least five times each
    # The queue: every merged chunk is the policy's (its first row is the state it was asked for).
    assert len(rig.merges.merges) == summary.chunks_received >= 5
    for merge in rig.merges.merges:
        assert merge.session_id == real_session
        assert not np.isclose(merge.chunk_robot, FORGED).any()
    # The recording: every executed policy action comes from the real session, none is forged.
    frames = rig.recording().frames
    executed = [f for f in frames if f.source == "policy"]
    assert executed
    assert {f.provenance[0] for f in executed if f.provenance} == {real_session}
    assert not any(np.isclose(np.frombuffer(f.action.data, "<f4"), FORGED).any() for f in frames if f.action)


@asynccontextmanager
async def sniffed_robot(port: int, tmp_path: Path) -> AsyncIterator[tuple[zenoh.Session, Tap, EdgeRig]]:
    """A server (5 ms policy), robot-7's edge streaming from it, and mallory, a peer on the same
    network whose tap sees every message on the robot's action key."""
    policy = FixedComputePolicy(compute_ms=5, **sim_policy_spec(chunk_size=20))
    async with (
        running_server(make_manifest(port), policy),
        PolicyClient.connect(peer_settings(port), "mallory") as mallory,
    ):
        tap = Tap(mallory.zsession, "@servo/*/*/*/c/robot-7/action")
        with closing(tap):
            async with edge_rig(port, tmp_path) as rig:
                yield mallory.zsession, tap, rig


async def test_replayed_chunks_are_never_merged_twice(port: int, tmp_path: Path) -> None:
    """Genuine chunks captured off the wire and replayed later fail the one-in-flight check."""
    async with sniffed_robot(port, tmp_path) as (z, tap, rig):
        await eventually(lambda: len(tap.seen) >= 3, 15, "three genuine chunks sniffed")
        captured = list(tap.seen)

        def replay() -> None:  # byte for byte, each captured chunk again
            for seen in captured:
                z.put(seen.key, seen.payload, attachment=seen.attachment)

        await keep_sending(
            replay, lambda: rig.engine.statistics().chunks_rejected["stale_seq"] >= 2 * len(captured), what="replays"
        )
        received = rig.engine.chunks_received
        await eventually(lambda: rig.engine.chunks_received >= received + 2, 10, "streaming on")
    merged = [(m.session_id, m.seq_id) for m in rig.merges.merges]
    assert len(merged) == len(set(merged))  # no chunk merged twice
    assert rig.summary.final_state == "streaming"


async def test_huge_messages_on_the_action_key_are_dropped_before_they_are_copied(port: int, tmp_path: Path) -> None:
    """A peer floods a robot's action key with a 2 MiB attachment and a 4 MiB body: both are
    refused on their size (the edge never copies them out of Zenoh) and the robot streams on."""
    async with sniffed_robot(port, tmp_path) as (z, tap, rig):
        await eventually(lambda: len(tap.seen) >= 1, 15, "the action key sniffed")
        action_key, attachment = tap.seen[0].key, tap.seen[0].attachment
        stats = rig.engine.statistics
        # Messages this large are often dropped by the peer's own congestion control at load:
        # it keeps sending until the robot has refused three of each.
        await keep_sending(
            lambda: z.put(action_key, b"x", attachment=b"\x00" * (2 << 20)),
            lambda: stats().chunks_rejected["mac"] >= 3,
            what="three huge attachments refused",
        )
        await keep_sending(
            lambda: z.put(action_key, b"\x00" * (4 << 20), attachment=attachment),
            lambda: stats().chunks_rejected["undecodable"] >= 3,
            what="three huge bodies refused",
        )
        received = rig.engine.chunks_received
        await eventually(lambda: rig.engine.chunks_received >= received + 2, 10, "streaming on")
    assert rig.summary.final_state == "streaming"
