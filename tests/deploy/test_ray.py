"""``servo-serve --ray``: replicas as actors on a local Ray cluster, joined through a Zenoh router.

The real command runs in a subprocess against a head the tests start (conftest); the replicas and
the test's client are Zenoh clients of a router opened in the test process. Every wait is on an
event: a line of the command's stderr, a liveliness change, a reply.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import anyio
import msgspec
import pytest
from anyio.streams.text import TextReceiveStream

from servo.client import PolicyClient, RemoteSession, ServerInfo
from servo.deploy.host import ReplicaReady, ReplicaStopped
from tests.deploy.helpers import RayHead, local_ray_head, watching
from tests.server.helpers import observation
from tests.server.test_cli import REPO, Lines, serve_process
from tests.support import client_settings

pytestmark = pytest.mark.anyio

APP = "ray-test"
READY = re.compile(r"servo-serve: replica (\S+) ready: .* pid (\d+) on ")
#: Loading torch and warming the reference policy in every replica at once, on 2 shared cores
#: (pytest's own per-test timeout, 120 s, covers the head's start as well).
START_TIMEOUT_S = 90.0


def ray_manifest(tmp_path: Path, router: int) -> Path:
    path = tmp_path / "manifest.toml"
    path.write_text(
        f"""
[model]
source = "reference"
warmup = 1
[model.options]
cameras = {{front = [24, 32]}}
[serving]
app = "{APP}"
[zenoh]
mode = "client"
listen = []
connect = ["tcp/127.0.0.1:{router}"]
[ops]
health_port = 0
"""
    )
    return path


def ray_args(head: RayHead, replicas: int) -> tuple[str, ...]:
    """Flags of a deployment on ``head``.

    Ray prints what the actors log to the same stderr from its own thread, a line's text and its
    newline in two writes: servo-serve's lines are whole but may not start a line, so the tests
    look for them anywhere in a line.
    """
    return ("--ray", "--ray-address", head.address, "--replicas", str(replicas))


async def ready_lines(lines: Lines, count: int) -> dict[str, int]:
    """The next ``count`` "replica … ready" lines: replica id → pid."""
    pids: dict[str, int] = {}
    while len(pids) < count:
        try:
            match = READY.search(await lines.until(READY.search, timeout=START_TIMEOUT_S))
        except TimeoutError:
            raise AssertionError("replicas not ready; servo-serve said:\n" + "\n".join(lines.seen)) from None
        assert match is not None
        pids[match[1]] = int(match[2])
    return pids


async def open_on(client: PolicyClient, server: ServerInfo) -> RemoteSession:
    return await client.open_session(server, features=server.status.policy.features, fps=server.status.policy.fps)


async def serves(session: RemoteSession) -> bool:
    result = await session.infer(*observation(0.5), timeout=10)
    return bool(result.chunk_robot.shape == (50, 6))


async def test_replicas_serve_with_distinct_ids_and_sigterm_drains_every_one(
    ray_head: RayHead, router: int, tmp_path: Path
) -> None:
    manifest = ray_manifest(tmp_path, router)
    async with serve_process(manifest, *ray_args(ray_head, 2)) as (process, lines):
        assert set(await ready_lines(lines, 2)) == {"reference-0", "reference-1"}
        await lines.until(lambda line: "servo-serve: ready" in line, timeout=10)
        async with PolicyClient.connect(client_settings(router), "robot") as client:
            with watching(client.zsession, f"@servo/{APP}/*/*/alive") as presence:
                await presence.until(lambda alive: len(alive) == 2, timeout=10)
                servers = await client.discover(app=APP)
                assert sorted(s.keys.replica for s in servers) == ["reference-0", "reference-1"]
                sessions = [await open_on(client, server) for server in servers]
                for session in sessions:
                    assert await serves(session)
                process.send_signal(signal.SIGTERM)
                for session in sessions:
                    with anyio.fail_after(15):
                        await session.lost.wait()
                    assert session.lost_reason == "server draining"
                await presence.until(lambda alive: not alive, timeout=15)
                for session in sessions:
                    await session.close()
        with anyio.fail_after(30):
            assert await process.wait() == 0
        output = "\n".join(await lines.rest(timeout=5))
    for replica in ("reference-0", "reference-1"):
        assert f"servo-serve: replica {replica} drained\n" in output
    assert "servo-serve: stopped" in output


async def test_a_killed_replica_comes_back_with_its_id_and_serves(
    ray_head: RayHead, router: int, tmp_path: Path
) -> None:
    manifest = ray_manifest(tmp_path, router)
    async with serve_process(manifest, *ray_args(ray_head, 2)) as (process, lines):
        pids = await ready_lines(lines, 2)
        async with PolicyClient.connect(client_settings(router), "robot") as client:
            with watching(client.zsession, f"@servo/{APP}/*/reference-1/alive") as presence:
                await presence.until(lambda alive: len(alive) == 1, timeout=10)
                (token,) = presence.alive
                os.kill(pids["reference-1"], signal.SIGKILL)
                await presence.until(lambda alive: not alive, timeout=10)
                survivor = await client.discover(app=APP)
                assert [s.keys.replica for s in survivor] == ["reference-0"]
                await presence.until(lambda alive: alive == {token}, timeout=START_TIMEOUT_S)
                assert presence.changes[-2:] == [(token, False), (token, True)]
                servers = {s.keys.replica: s for s in await client.discover(app=APP)}
                assert set(servers) == {"reference-0", "reference-1"}
                session = await open_on(client, servers["reference-1"])
                assert await serves(session)
                await session.close()
        await lines.until(lambda line: "servo-serve: replica reference-1 lost (its process died)" in line, timeout=10)
        restarted = await ready_lines(lines, 1)
        assert set(restarted) == {"reference-1"}
        assert restarted["reference-1"] != pids["reference-1"]
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            assert await process.wait() == 0


@pytest.mark.slow
async def test_draining_the_node_drains_its_replicas(router: int, tmp_path: Path) -> None:
    """SIGTERM to ``ray start --block`` drains the node (Ray ≥ 2.5x): its replicas drain themselves."""
    manifest = ray_manifest(tmp_path, router)
    with local_ray_head() as head:
        async with serve_process(manifest, *ray_args(head, 1)) as (_, lines):
            await ready_lines(lines, 1)
            async with PolicyClient.connect(client_settings(router), "robot") as client:
                with watching(client.zsession, f"@servo/{APP}/*/*/alive") as presence:
                    await presence.until(lambda alive: len(alive) == 1, timeout=10)
                    (server,) = await client.discover(app=APP)
                    session = await open_on(client, server)
                    head.process.send_signal(signal.SIGTERM)
                    with anyio.fail_after(15):
                        await session.lost.wait()
                    assert session.lost_reason == "server draining"
                    await presence.until(lambda alive: not alive, timeout=5)
                    await session.close()
            # the replica's own log, forwarded by Ray to the driver's stderr: it saw the node drain
            await lines.until(lambda line: "node draining" in line, timeout=10)


@pytest.mark.slow
async def test_sigterm_to_a_replica_process_drains_it_and_ray_restarts_it(
    ray_head: RayHead, router: int, tmp_path: Path
) -> None:
    manifest = ray_manifest(tmp_path, router)
    async with serve_process(manifest, *ray_args(ray_head, 1)) as (process, lines):
        pids = await ready_lines(lines, 1)
        async with PolicyClient.connect(client_settings(router), "robot") as client:
            with watching(client.zsession, f"@servo/{APP}/*/*/alive") as presence:
                await presence.until(lambda alive: len(alive) == 1, timeout=10)
                (server,) = await client.discover(app=APP)
                session = await open_on(client, server)
                os.kill(pids["reference-0"], signal.SIGTERM)
                with anyio.fail_after(15):
                    await session.lost.wait()
                assert session.lost_reason == "server draining"
                await presence.until(lambda alive: not alive, timeout=5)
                await session.close()
                await presence.until(lambda alive: len(alive) == 1, timeout=START_TIMEOUT_S)
                (server,) = await client.discover(app=APP)
                session = await open_on(client, server)
                assert await serves(session)
                await session.close()
        assert set(await ready_lines(lines, 1)) == {"reference-0"}
        # A stop on purpose, said as one: not a lost replica, nor Ray's "unexpected system error".
        said = "\n".join(lines.seen)
        assert "replica reference-0 restarting (SIGTERM): drained" in said, said
        assert not re.search(r"lost \(|unexpected system error", said), said
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            assert await process.wait() == 0


async def test_a_replica_that_cannot_start_stops_the_deployment_with_exit_2(
    ray_head: RayHead, router: int, tmp_path: Path
) -> None:
    manifest = ray_manifest(tmp_path, router)
    manifest.write_text(manifest.read_text().replace('source = "reference"', 'source = "no_such_module:factory"'))
    async with serve_process(manifest, *ray_args(ray_head, 2)) as (process, lines):
        line = await lines.until(lambda line: "servo-serve: error:" in line, timeout=START_TIMEOUT_S)
        assert re.search(r"servo-serve: error: replica no_such_module-factory-[01]: model\.source 'no_such", line)
        with anyio.fail_after(30):
            assert await process.wait() == 2


def json_lines(text: str) -> list[str]:
    """The driver's own lines: Ray also forwards what its actors print to the driver's stdout."""
    return [line for line in text.splitlines() if line.startswith("{")]


@pytest.mark.slow
async def test_the_python_api_deploys_waits_and_drains(ray_head: RayHead, router: int, tmp_path: Path) -> None:
    manifest = ray_manifest(tmp_path, router)
    command = [sys.executable, "-m", "tests.deploy.api_driver", str(manifest), ray_head.address, "2"]
    async with await anyio.open_process(command, cwd=REPO) as driver:
        assert driver.stdout is not None
        assert driver.stdin is not None
        out = TextReceiveStream(driver.stdout)
        text = ""
        with anyio.fail_after(START_TIMEOUT_S):
            while len(json_lines(text)) < 2 or not text.endswith("\n"):
                text += await out.receive()
        ready = [msgspec.json.decode(line, type=ReplicaReady) for line in json_lines(text)]
        assert [r.replica for r in ready] == ["reference-0", "reference-1"]
        async with PolicyClient.connect(client_settings(router), "robot") as client:
            servers = await client.discover(app=APP)
            assert sorted(s.keys.prefix for s in servers) == [r.key for r in ready]
            session = await open_on(client, servers[0])
            await driver.stdin.send(b"drain\n")
            with anyio.fail_after(15):
                await session.lost.wait()
            assert session.lost_reason == "server draining"
            await session.close()
        with anyio.fail_after(30):
            async for chunk in out:
                text += chunk
            assert await driver.wait() == 0
    stopped = [msgspec.json.decode(line, type=ReplicaStopped) for line in json_lines(text)[2:]]
    assert stopped == [ReplicaStopped(r, drained=True) for r in ("reference-0", "reference-1")]


@pytest.mark.slow
async def test_sighup_restarts_the_replicas_one_at_a_time(ray_head: RayHead, router: int, tmp_path: Path) -> None:
    manifest = ray_manifest(tmp_path, router)
    async with serve_process(manifest, *ray_args(ray_head, 2)) as (process, lines):
        pids = await ready_lines(lines, 2)
        await lines.until(lambda line: "servo-serve: ready" in line, timeout=10)
        async with PolicyClient.connect(client_settings(router), "robot") as client:
            with watching(client.zsession, f"@servo/{APP}/*/*/alive") as presence:
                await presence.until(lambda alive: len(alive) == 2, timeout=10)
                tokens = set(presence.alive)
                sessions = [await open_on(client, server) for server in await client.discover(app=APP)]
                process.send_signal(signal.SIGHUP)
                for _ in range(2):  # each token goes and comes back
                    await presence.until(lambda alive: len(alive) == 1, timeout=15)
                    await presence.until(lambda alive: len(alive) == 2, timeout=START_TIMEOUT_S)
                await lines.until(lambda line: "servo-serve: rolling restart done" in line, timeout=10)
                for session in sessions:
                    assert session.lost_reason == "server draining"
                    await session.close()
                # One at a time: never both gone, and the first was back before the second left.
                gone = [key for key, up in presence.changes[-4:] if not up]
                assert presence.changes[-4:] == [(gone[0], False), (gone[0], True), (gone[1], False), (gone[1], True)]
                assert set(gone) == tokens
                servers = await client.discover(app=APP)
                assert sorted(s.keys.replica for s in servers) == ["reference-0", "reference-1"]
                session = await open_on(client, servers[0])
                assert await serves(session)
                await session.close()
        again = re.compile(r"rolling restart: replica (\S+) serves again \(pid (\d+)\)")
        restarted = {match[1]: int(match[2]) for line in lines.seen if (match := again.search(line))}
        assert restarted.keys() == pids.keys()
        assert all(restarted[replica] != pid for replica, pid in pids.items())
        said = "\n".join(lines.seen)
        for replica in pids:
            assert f"replica {replica} restarting (rolling restart): drained" in said, said
        assert not re.search(r"lost \(|unexpected system error", said), said
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            assert await process.wait() == 0
