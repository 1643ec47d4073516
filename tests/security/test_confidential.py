"""A peer that joins the link reads nothing of another robot's session.

Issue 29: chunks and observations were sealed (authenticated) but not encrypted, so a stranger
that joined a plain-TCP server as a Zenoh client and subscribed to ``@servo/**`` decoded another
robot's chunks (matching their provenance) and read its camera frames. Since wire schema 3 every
session body is encrypted with the session's keys (`servo._core.SessionKey`): the stranger still
receives the messages Zenoh routes to it, and learns their sizes and headers, but none of their
content.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import msgspec
import numpy as np
import pytest

from servo._core import KeyPair
from servo.client import PolicyClient
from servo.transport import query
from servo.wire import (
    NONCE_SIZE,
    ActionChunk,
    AuditQuery,
    ControlAck,
    Observation,
    ResetRequest,
    Trajectory,
    TrajectoryRequest,
    WireError,
    decode,
    decode_floats,
    encode,
    trajectory_request_transcript,
)
from tests.security.peers import peer_settings
from tests.security.test_trajectories import wave_library
from tests.server.helpers import cameras_of, connected, observation, open_on
from tests.server.policies import FixedComputePolicy
from tests.support import eventually, make_manifest, running_server

pytestmark = pytest.mark.anyio

STATE = 42.25


def frame(height: int, width: int) -> np.ndarray:
    """A camera frame nobody could guess: what the robot's camera sees."""
    return np.random.default_rng(29).integers(0, 256, (height, width, 3), np.uint8)


def readable(payload: bytes) -> list[str]:
    """What of a message body decodes as a session body (each would be a leak)."""
    leaks = []
    for kind in (Observation, ActionChunk, ControlAck, ResetRequest):
        try:
            decode(payload, kind)
        except WireError:
            continue
        leaks.append(kind.__name__)
    return leaks


async def test_a_stranger_on_a_plain_tcp_link_decodes_nothing_of_another_robots_session(port: int) -> None:
    async with (
        running_server(make_manifest(port), FixedComputePolicy(compute_ms=2)) as (_, ready),
        connected(port, "robot-7", jpeg_quality=0) as victim,  # raw frames: the camera's own bytes
        PolicyClient.connect(peer_settings(port), "stranger") as stranger,
    ):
        seen: list[tuple[str, bytes]] = []
        sub = stranger.zsession.declare_subscriber(
            "@servo/**", lambda s: seen.append((str(s.key_expr), s.payload.to_bytes()))
        )
        try:
            session = await open_on(victim, ready)
            frames = {name: frame(h, w) for name, (h, w) in cameras_of(ready).items()}
            state = np.full(len(ready.info.features.state_names), STATE, np.float32)
            results = [await session.infer(state, frames, timeout=5) for _ in range(3)]
            await session.reset(1)
            keys = ready.keys.client("robot-7")
            await eventually(lambda: sum(key == keys.action for key, _ in seen) >= 3, what="the chunks, routed")
            await session.close()
        finally:
            sub.undeclare()
    observations = [payload for key, payload in seen if key == keys.obs]
    chunks = [payload for key, payload in seen if key == keys.action]
    assert len(observations) >= 3  # the stranger received every message: Zenoh routes them to it
    secrets = [f.reshape(-1)[i : i + 48].tobytes() for f in frames.values() for i in (0, f.size // 2)]
    secrets += [state.tobytes(), results[0].chunk_robot[:2].tobytes()]
    assert all(len(s) >= 24 for s in secrets)
    for payload in observations + chunks:
        assert readable(payload) == []
        assert not [s for s in secrets if s in payload]
    assert all(np.all(r.chunk_robot[0] == STATE) for r in results)  # the robot itself read them


async def test_a_trajectory_travels_encrypted_to_the_robot_that_fetched_it(port: int, tmp_path: Path) -> None:
    """The answer to a fetch is encrypted to the fetcher's ephemeral key: what crosses the link
    (and what anybody reading the reply gets) is no trajectory."""
    frames, library = wave_library(tmp_path, 30)
    manifest = make_manifest(port, extra=library)
    async with running_server(manifest) as (_, ready), connected(port, "robot-7") as robot:
        request = TrajectoryRequest(
            "wave", secrets.token_bytes(NONCE_SIZE), KeyPair().public_key, "robot-7", robot.identity.public_key
        )
        signature = robot.identity.sign(trajectory_request_transcript(request, ready.keys.prefix))
        payload = encode(msgspec.structs.replace(request, signature=signature))
        (reply,) = await query(robot.zsession, ready.keys.trajectory, payload=payload, timeout=5)
        assert reply.ok is not None
        sent = reply.ok.payload.to_bytes()
        (server,) = [s for s in await robot.discover() if s.keys == ready.keys]
        fetched = await robot.fetch_trajectory(server, "wave")
    with pytest.raises(WireError):
        decode(sent, Trajectory)
    assert frames[:2].tobytes() not in sent
    np.testing.assert_array_equal(decode_floats(fetched.positions, shape=(None, frames.shape[1]), what="p"), frames)


async def test_a_stranger_reads_no_audit_row(port: int) -> None:
    """Any peer could query a replica's ``…/audit`` and read another robot's last requests."""
    async with (
        running_server(make_manifest(port), FixedComputePolicy(compute_ms=1)) as (_, ready),
        connected(port, "robot-7") as victim,
        PolicyClient.connect(peer_settings(port), "stranger") as stranger,
    ):
        session = await open_on(victim, ready)
        await session.infer(*observation(1), timeout=5)
        replies = await query(stranger.zsession, ready.keys.audit, payload=encode(AuditQuery()), timeout=2)
    assert replies
    for reply in replies:
        payload = (reply.ok or reply.err).payload.to_bytes()  # type: ignore[union-attr]
        assert b"robot-7" not in payload
        assert session.session_id.encode() not in payload
