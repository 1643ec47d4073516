"""A robot replays only its own server's trajectory, obeys no refusal it cannot verify, and a
stranger fetches none.

Issue 18: the trajectory fetch was unauthenticated. ``servo-edge --replay server:NAME`` ran the
first reply it got, from anyone: an edge pinned with ``--trusted-servers`` followed an attacker's
trajectory in 2 of 5 tries, and a forged error reply stopped the pinned replay in 1 of 1. Now
the replica signs its answer (or its refusal) over the request's fresh nonce, and the edge
believes only a signature by the identity it trusts for that replica (pins, or known servers).

Issue 29: once answers were encrypted, a stranger could still fetch a trajectory, encrypted to
its own key. Now the request is signed by the robot and admitted like a session open.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import anyio
import msgspec
import numpy as np
import pytest
import zenoh
from zenoh.handlers import Callback

from servo._core import KeyPair, ServerIdentity
from servo.client import PolicyClient, ServerError
from servo.edge.config import EdgeConfig, SecurityConfig
from servo.edge.replay import ReplayEngine
from servo.edge.runtime import EdgeRuntime, RunOptions, RunSummary
from servo.server.signed_door import Signed
from servo.server.trajectories import seal_trajectory
from servo.transport import query
from servo.wire import (
    NONCE_SIZE,
    Rejection,
    Trajectory,
    TrajectoryRequest,
    decode,
    decode_floats,
    encode,
    encode_tensor,
)
from tests.edge.test_replay import executed, sim, trajectory, write_recording
from tests.edge.test_replay import replay as replay_options
from tests.security.lan import lan_client, lan_server
from tests.security.peers import closing, peer_settings
from tests.server.helpers import open_on
from tests.support import free_port, make_manifest, running_server

pytestmark = pytest.mark.anyio

HOSTILE_OFFSET = 25.0


class TrajectoryForger:
    """A queryable on the real replica's trajectory key (anyone may declare one on a flat network)
    that answers every fetch at once, before the server: a forged trajectory, the same signed by
    an identity of its own, or a forged refusal."""

    def __init__(self, z: zenoh.Session, key: str, forgery: str, frames: np.ndarray, joints: list[str]) -> None:
        self.answered = 0
        self._key, self._forgery, self._identity = key, forgery, ServerIdentity.generate()
        self._body = encode(Trajectory("wave", joints, 30.0, encode_tensor(frames + HOSTILE_OFFSET)))
        self._queryable = z.declare_queryable(key, Callback(self._answer, indirect=False))

    def _answer(self, query: zenoh.Query) -> None:
        with query:
            request = decode(b"" if query.payload is None else query.payload.to_bytes(), TrajectoryRequest)
            if self._forgery == "refusal":
                query.reply_err(encode(Rejection("bad_request", "no trajectory 'wave'; available: none")))
            elif self._forgery == "trajectory signed by another identity":
                # Encrypted to the robot and signed exactly as a replica would, by an identity of its own.
                sealed = seal_trajectory(request, self._body, self._identity, self._key.split("/")[3])
                assert isinstance(sealed, Signed)
                query.reply(self._key, sealed.body, attachment=sealed.attachment)
            else:
                query.reply(self._key, self._body)
            self.answered += 1

    def close(self) -> None:
        self._queryable.undeclare()


async def replay(config: EdgeConfig, record: Path) -> tuple[RunSummary, ReplayEngine]:
    robot = sim()
    engine = ReplayEngine(config, robot.spec())
    with anyio.fail_after(60):
        summary = await EdgeRuntime(robot, engine, config, RunOptions(duration_s=20.0, record_path=str(record))).run()
    return summary, engine


def wave_library(tmp_path: Path, frames: int) -> tuple[np.ndarray, str]:
    """A recorded trajectory ``wave`` of the simulated arm, and the manifest lines serving it."""
    spec = sim().spec()
    positions = trajectory(np.asarray(spec.rest_pose, np.float32), frames=frames)
    source = tmp_path / "wave.servo"
    write_recording(source, positions, list(spec.joint_names))
    return positions, f'[[trajectories]]\nname = "wave"\npath = "{source}"\n'


@pytest.mark.parametrize("forgery", ["trajectory", "trajectory signed by another identity", "refusal"])
@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "unpinned"])
async def test_a_forged_trajectory_or_refusal_is_never_obeyed(
    port: int, tmp_path: Path, forgery: str, pinned: bool
) -> None:
    spec = sim().spec()
    frames, library = wave_library(tmp_path, 60)
    manifest = make_manifest(port, extra=library)
    async with (
        running_server(manifest) as (_, ready),
        PolicyClient.connect(peer_settings(port), "mallory") as mallory,
    ):
        forger = TrajectoryForger(mallory.zsession, ready.keys.trajectory, forgery, frames, list(spec.joint_names))
        with closing(forger):
            pins = [ready.fingerprint] if pinned else []
            config = msgspec.structs.replace(
                replay_options("server:wave", port=port), security=SecurityConfig(trusted_servers=pins)
            )
            summary, engine = await replay(config, tmp_path / "replayed.servo")
    assert forger.answered >= 1  # it answered the robot's fetch
    assert summary.stop_reason == "finished"  # not stopped by the forged refusal
    commands, _ = executed(tmp_path / "replayed.servo")
    np.testing.assert_allclose(commands[-len(frames) :], frames, atol=1e-4)  # the genuine trajectory
    assert not (np.abs(commands - (frames[:1] + HOSTILE_OFFSET)) < 1e-3).all(axis=1).any()
    assert engine.client is not None
    assert engine.client.statistics().chunks_rejected["mac"] >= 1  # the forgery, dropped and counted


async def test_a_stranger_fetches_no_trajectory_from_a_lan_server_and_a_joined_robot_does(tmp_path: Path) -> None:
    frames, library = wave_library(tmp_path, 30)
    port = free_port()
    async with lan_server(port, security=library) as (server, ready):
        async with lan_client(server, port, tmp_path, "mallory") as mallory:
            (info,) = [s for s in await mallory.discover() if s.keys == ready.keys]
            with pytest.raises(ServerError) as stranger:  # signed by a key nobody enrolled
                await mallory.fetch_trajectory(info, "wave")
            unsigned = TrajectoryRequest("wave", secrets.token_bytes(NONCE_SIZE), KeyPair().public_key)
            (reply,) = await query(mallory.zsession, ready.keys.trajectory, payload=encode(unsigned), timeout=5)
        async with lan_client(server, port, tmp_path, "robot-7", join=ready.join_token) as robot:
            with pytest.raises(ServerError) as early:  # not enrolled yet: the token is proved by a session open
                await robot.fetch_trajectory(info, "wave")
            await (await open_on(robot, ready)).close()
            fetched = await robot.fetch_trajectory(info, "wave")
        async with lan_client(server, port, tmp_path, "impostor") as impostor:
            impostor.client_id = "robot-7"  # the enrolled robot's name, signed by another key
            with pytest.raises(ServerError) as squatter:
                await impostor.fetch_trajectory(info, "wave")
    assert (stranger.value.code, early.value.code) == ("unauthenticated", "unauthenticated")
    assert "'mallory'" in stranger.value.message
    assert "is not enrolled on this server" in stranger.value.message
    assert reply.err is not None
    refusal = decode(reply.err.payload.to_bytes(), Rejection)
    assert refusal.code == "unauthenticated"
    assert "signed by the robot asking" in refusal.reason
    assert squatter.value.code == "unauthenticated"
    assert "robot 'robot-7' is enrolled as" in squatter.value.message
    positions = decode_floats(fetched.positions, shape=(None, frames.shape[1]), what="positions")
    np.testing.assert_array_equal(positions, frames)
