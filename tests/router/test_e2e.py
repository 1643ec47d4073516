"""A real policy server and real robots, all in client mode with mTLS behind a real router.

robot-7 opens a session and streams; robot-8 (a fleet member with its own valid certificate) tries
to feed robot-7's session with a forged observation and to read its chunks. The server never
sees the forgery (its request counters prove it) and robot-8 never sees a chunk of robot-7.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import numpy as np
import pytest
import zenoh

from servo._core import MSG_OBS, SCHEMA_VERSION, Header, KeyPair, unauthenticated
from servo.client import PolicyClient, RemoteSession, RequestTimeout
from servo.edge.remote import RemoteEngine
from servo.router import load_fleet, run_router
from servo.server.manifest import parse_manifest
from servo.server.service import PolicyServer, ServerReady
from servo.transport import declare_obs_publisher, open_zsession, query
from servo.wire import Observation, Rejection, SessionOpen, decode, encode, encode_image, encode_tensor
from tests.edge.harness import edge_config, running_edge, small_sim
from tests.router.harness import Credentials, Inbox, fleet_toml, wait_matching
from tests.server.policies import CHUNK, FixedComputePolicy
from tests.support import eventually, free_port, running_server

pytestmark = pytest.mark.anyio

SHAPE = (48, 64)
SIM_JOINTS = small_sim().spec().joint_names


def _manifest(creds: Credentials, port: int) -> str:
    gpu = creds.leaves["gpu-0"]
    return f"""
[model]
source = "injected"
warmup = 1
[zenoh]
mode = "client"
connect = ["tls/127.0.0.1:{port}"]
[zenoh.tls]
root_ca_certificate = "{creds.pki.ca}"
connect_certificate = "{gpu.cert}"
connect_private_key = "{gpu.key}"
enable_mtls = true
[ops]
health_port = 0
"""


def _obs() -> tuple[np.ndarray, dict[str, np.ndarray]]:
    return np.zeros(6, np.float32), {"front": np.zeros((*SHAPE, 3), np.uint8)}


def _forged_observation() -> tuple[bytes, bytes]:
    body = encode(
        Observation(
            state=encode_tensor(np.ones(6, np.float32)),
            images={"front": encode_image(np.zeros((*SHAPE, 3), np.uint8), 0)},
            task="",
            inference_delay_steps=0,
            prefix_model=None,
            prefix_robot=None,
        )
    )
    header = Header(
        schema_version=SCHEMA_VERSION,
        msg_type=MSG_OBS,
        flags=0,
        seq_id=424242,
        episode_id=0,
        session_epoch=0,
        client_mono_ns=time.monotonic_ns(),
        session_id=bytes(16),
    )
    return body, unauthenticated(header)


async def _open(client: PolicyClient) -> RemoteSession:
    (server,) = await client.discover()
    return await client.open_session(server, features=server.status.policy.features, fps=30)


def _served(server: PolicyServer) -> tuple[float, float]:
    registry = server.metrics.registry
    ok = registry.get_sample_value("servo_requests_total", {"outcome": "ok"}) or 0.0
    return ok, registry.get_sample_value("servo_superseded_observations_total") or 0.0


def _rejected(server: PolicyServer) -> dict[str, float]:
    """``servo_observations_rejected_total`` by reason: what reached the server and was dropped."""
    return {
        sample.labels["reason"]: sample.value
        for family in server.metrics.registry.collect()
        for sample in family.samples
        if sample.name == "servo_observations_rejected_total" and sample.value
    }


@asynccontextmanager
async def _mtls_fleet(
    creds: Credentials, tmp_path: Path
) -> AsyncIterator[tuple[PolicyServer, ServerReady, zenoh.Session, zenoh.Session]]:
    """An mTLS router, the server behind it and the sessions of robot-7 and robot-8 (fleet members).

    The server has drained when the block ends.
    """
    port = free_port()
    fleet_file = tmp_path / "fleet.toml"
    fleet_file.write_text(fleet_toml("mtls", port, creds.pki, None))
    async with anyio.create_task_group() as tg:
        await tg.start(run_router, load_fleet(fleet_file))
        policy = FixedComputePolicy(cameras={"front": SHAPE})
        async with (
            running_server(parse_manifest(_manifest(creds, port)), policy) as (server, ready),
            open_zsession(creds.mtls("robot-7", port)) as z7,
            open_zsession(creds.mtls("robot-8", port)) as z8,
        ):
            yield server, ready, z7, z8
        tg.cancel_scope.cancel()


async def test_robot_streams_through_the_router_and_another_robot_cannot_touch_its_session(
    creds: Credentials, tmp_path: Path
) -> None:
    async with _mtls_fleet(creds, tmp_path) as (server, _, z7, z8):
        robot7 = await _open(PolicyClient(z7, "robot-7"))
        assert (await robot7.infer(*_obs(), timeout=10)).chunk_robot.shape == (CHUNK, 6)

        sniffed = Inbox()
        z8.declare_subscriber(robot7.keys.action, sniffed.samples())
        forged = declare_obs_publisher(z8, robot7.keys.obs)
        wait_matching(forged)  # robot-8 sees the server's c/*/obs subscriber: the put leaves it
        body, attachment = _forged_observation()
        forged.put(body, attachment=attachment)

        assert (await robot7.infer(*_obs(), timeout=10)).seq_id == 2
        # Positive control: robot-8's own session, opened and served after the forgery and
        # after robot-7's second chunk, over the same link.
        robot8 = await _open(PolicyClient(z8, "robot-8"))
        assert (await robot8.infer(*_obs(), timeout=10)).chunk_robot.shape == (CHUNK, 6)
        assert (await robot7.infer(*_obs(), timeout=10)).seq_id == 3
        await robot7.close()
        await robot8.close()
    # The server has drained: every request it took is accounted for.
    assert _served(server) == (4.0, 0.0)  # 3 for robot-7, 1 for robot-8; the forgery never arrived
    assert _rejected(server) == {}  # not even to be dropped unauthenticated: the router stopped it
    assert sniffed.items == []


async def test_another_robot_cannot_open_or_replace_a_robots_session(creds: Credentials, tmp_path: Path) -> None:
    """robot-8 (valid fleet certificate) tries to open a session named robot-7, which used to replace
    robot-7's: on robot-7's session key the router drops the query, and on its own key, naming
    robot-7 in the body, the server refuses. robot-7's session is untouched and keeps streaming."""
    async with _mtls_fleet(creds, tmp_path) as (server, ready, z7, z8):
        robot7 = await _open(PolicyClient(z7, "robot-7"))
        assert (await robot7.infer(*_obs(), timeout=10)).seq_id == 1
        impostor = PolicyClient(z8, "robot-7")
        (seen,) = await impostor.discover()
        with pytest.raises(RequestTimeout):  # robot-7's session key: denied by the router
            await impostor.open_session(seen, features=ready.info.features, fps=30, timeout=1.0)
        squat = SessionOpen("robot-7", [SCHEMA_VERSION], ready.info.features, 30.0, KeyPair().public_key)
        (reply,) = await query(z8, ready.keys.client("robot-8").session, payload=encode(squat), timeout=2)
        assert reply.err is not None
        rejection = decode(reply.err.payload.to_bytes(), Rejection)
        assert rejection.code == "bad_request"
        assert "does not match the key's 'robot-8'" in rejection.reason
        assert (await robot7.infer(*_obs(), timeout=10)).seq_id == 2
        (session,) = server.registry.snapshot()
        assert (session.client_id, session.session_id) == ("robot-7", robot7.session_id)
        await robot7.close()
    assert server.metrics.registry.get_sample_value("servo_sessions_opened_total") == 1


async def test_a_robot_joins_a_password_fleet_as_its_user(creds: Credentials, tmp_path: Path) -> None:
    """servo-edge's auth_user / auth_password_file: the robot's client id is its user name, so the
    router's per-robot rules (keyed by that name) let it stream."""
    port = free_port()
    fleet_file = tmp_path / "fleet.toml"
    fleet_file.write_text(fleet_toml("usrpwd", port, None, creds.passwords))
    manifest = f"""
[model]
source = "injected"
warmup = 1
[zenoh]
mode = "client"
connect = ["tcp/127.0.0.1:{port}"]
[zenoh.auth]
user = "gpu-0"
password_file = "{creds.secrets["gpu-0"]}"
[ops]
health_port = 0
"""
    policy = FixedComputePolicy(joints=tuple(SIM_JOINTS), cameras={"front": SHAPE}, chunk_size=20)
    async with anyio.create_task_group() as tg:
        await tg.start(run_router, load_fleet(fleet_file))
        async with running_server(parse_manifest(manifest), policy):
            sim = small_sim()
            config = edge_config(port, auth_user="robot-7", auth_password_file=str(creds.secrets["robot-7"]))
            engine = RemoteEngine(config, sim.spec())
            assert engine.client_id == "robot-7"
            async with running_edge(sim, engine) as run:
                await eventually(lambda: engine.chunks_received >= 2, 15, "streaming through the router")
                summary = await run.stop()
        tg.cancel_scope.cancel()
    assert summary.final_state == "streaming"
