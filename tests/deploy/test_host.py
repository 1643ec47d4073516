"""`ReplicaHost`: a server on its own event loop, driven from other threads as a cluster actor drives it."""

from __future__ import annotations

import os

import anyio
import pytest
import zenoh

from servo.client import NoServerFound
from servo.deploy.host import (
    ReplicaFailed,
    ReplicaHost,
    ReplicaReady,
    ReplicaStopped,
    decode_status,
    encode_status,
)
from servo.server.manifest import parse_manifest
from tests.deploy.helpers import watching
from tests.server.helpers import connected, observation, server_manifest
from tests.server.policies import FixedComputePolicy, WarmupGatedPolicy
from tests.support import free_port

pytestmark = pytest.mark.anyio


async def test_host_serves_and_drain_tells_sessions_and_withdraws_the_token(port: int) -> None:
    host = ReplicaHost(server_manifest(port, serving='app = "hosted"\nreplica = "r-0"'), policy=FixedComputePolicy())
    ready = await anyio.to_thread.run_sync(host.wait_ready, 30)
    assert isinstance(ready, ReplicaReady)
    assert (ready.replica, ready.key, ready.pid) == ("r-0", "@servo/hosted/test-policy/r-0", os.getpid())
    async with connected(port, "arm") as client:
        with watching(client.zsession, f"{ready.key}/alive") as presence:
            await presence.until(lambda alive: bool(alive), timeout=5)
            (server,) = await client.discover(app="hosted")
            assert server.keys.replica == "r-0"
            session = await client.open_session(server, features=server.status.policy.features, fps=30)
            result = await session.infer(*observation(1.0), timeout=10)
            assert result.chunk_robot.shape == (10, 6)
            stopped = await anyio.to_thread.run_sync(host.drain, 10)
            assert stopped == ReplicaStopped("r-0", drained=True)
            with anyio.fail_after(5):
                await session.lost.wait()
            assert session.lost_reason == "server draining"
            await presence.until(lambda alive: not alive, timeout=5)
            await session.close()
        with pytest.raises(NoServerFound):
            await client.discover(app="hosted", timeout=0.5)
    assert host.wait_stopped(0) == stopped
    assert host.drain(1) == stopped  # draining again is harmless


NO_ROUTER = f'mode = "client"\nlisten = []\nconnect = ["tcp/127.0.0.1:{free_port()}"]'


@pytest.mark.parametrize(
    ("source", "zenoh_section", "bad_config", "message"),
    [
        ("no_such_module:factory", "", True, "model.source 'no_such_module:factory'"),
        ("reference", NO_ROUTER, False, "Unable to connect"),
    ],
    ids=["bad policy", "no router"],
)
async def test_a_start_that_fails_is_reported_not_raised(
    port: int, source: str, zenoh_section: str, bad_config: bool, message: str
) -> None:
    listen = f'listen = ["tcp/127.0.0.1:{port}"]'
    manifest = parse_manifest(
        f'[model]\nsource = "{source}"\nwarmup = 0\n[model.options]\ncameras = {{front = [24, 32]}}\n'
        f'[serving]\nreplica = "r-0"\n[zenoh]\n{zenoh_section or listen}\n[ops]\nhealth_port = 0\n'
    )
    host = ReplicaHost(manifest)
    failed = await anyio.to_thread.run_sync(host.wait_ready, 60)
    assert isinstance(failed, ReplicaFailed)
    assert failed.bad_config is bad_config
    assert message in failed.error
    assert " at /" not in failed.error
    stopped = await anyio.to_thread.run_sync(host.wait_stopped, 10)
    assert stopped == ReplicaStopped("r-0", drained=False, error=failed.error)


async def test_drain_while_warming_up_abandons_the_start(port: int) -> None:
    policy = WarmupGatedPolicy()
    host = ReplicaHost(server_manifest(port, serving='replica = "r-0"'), policy=policy)
    assert await anyio.to_thread.run_sync(policy.warming.wait, 10)
    host.drain_nowait()
    policy.release.set()
    assert await anyio.to_thread.run_sync(host.wait_stopped, 10) == ReplicaStopped("r-0", drained=True)
    assert host.wait_ready(0) == ReplicaFailed("r-0", "drained before it was ready")
    with pytest.raises(zenoh.ZError):  # the server never opened its Zenoh session
        async with connected(port, "arm"):
            pass


def test_statuses_cross_as_msgpack_bytes() -> None:
    for status in (
        ReplicaReady("r-0", "@servo/a/m/r-0", "m", "rev", 12, "node", None),
        ReplicaFailed("r-0", "boom", bad_config=True),
        ReplicaStopped("r-0", drained=False, error="lost", restarting=True),
    ):
        data = encode_status(status)
        assert isinstance(data, bytes)
        assert decode_status(data) == status
