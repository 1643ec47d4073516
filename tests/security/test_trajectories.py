"""A robot replays only its own server's trajectory, and obeys no refusal it cannot verify.

Issue 18: the trajectory fetch was unauthenticated. ``servo-edge --replay server:NAME`` ran the
first reply it got, from anyone: an edge pinned with ``--trusted-servers`` followed an attacker's
trajectory in 2 of 5 tries, and a forged error reply stopped the pinned replay in 1 of 1. Now
the replica signs its answer (or its refusal) over the request's fresh nonce, and the edge
believes only a signature by the identity it trusts for that replica (pins, or known servers).
"""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec
import numpy as np
import pytest
import zenoh
from zenoh.handlers import Callback

from servo._core import ServerIdentity
from servo.client import PolicyClient
from servo.edge.config import EdgeConfig, SecurityConfig
from servo.edge.replay import ReplayEngine
from servo.edge.runtime import EdgeRuntime, RunOptions, RunSummary
from servo.server.trajectories import Signed, seal_trajectory
from servo.wire import Rejection, Trajectory, TrajectoryRequest, decode, encode, encode_tensor
from tests.edge.test_replay import executed, sim, trajectory, write_recording
from tests.edge.test_replay import replay as replay_options
from tests.security.peers import closing, peer_settings
from tests.support import make_manifest, running_server

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


@pytest.mark.parametrize("forgery", ["trajectory", "trajectory signed by another identity", "refusal"])
@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "unpinned"])
async def test_a_forged_trajectory_or_refusal_is_never_obeyed(
    port: int, tmp_path: Path, forgery: str, pinned: bool
) -> None:
    spec = sim().spec()
    frames = trajectory(np.asarray(spec.rest_pose, np.float32), frames=60)
    source = tmp_path / "wave.servo"
    write_recording(source, frames, list(spec.joint_names))
    manifest = make_manifest(port, extra=f'[[trajectories]]\nname = "wave"\npath = "{source}"\n')
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
