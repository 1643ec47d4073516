"""Operations: discovery across replicas, /healthz through the lifecycle, /metrics, audit log."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import anyio
import psutil
import pytest

from servo.client import ServerError, SessionLost
from servo.httpd import MAX_CONNECTIONS, HttpEndpoint, Response, text
from servo.server.ops import OpsEndpoint
from servo.server.service import PolicyServer, ServerReady
from tests.server.helpers import connected, observation, open_on, server_manifest
from tests.server.policies import FixedComputePolicy, GatedPolicy
from tests.support import eventually, free_port, running_server

pytestmark = pytest.mark.anyio


async def http_get(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    with anyio.fail_after(5):
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
            data = b""
            try:
                while True:
                    data += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


async def test_every_replica_answers_discovery_sorted_by_load(port: int) -> None:
    second = free_port()
    first_manifest = server_manifest(port, serving='app = "fleet"\nreplica = "r1"')
    second_manifest = server_manifest(
        second,
        serving='app = "fleet"\nreplica = "r2"',
        zenoh=f'connect = ["tcp/127.0.0.1:{port}"]',
        extra="[security]\nlisten_beside_router = true",  # a peer mesh of two servers, on purpose
    )
    async with (
        running_server(first_manifest, policy=FixedComputePolicy()) as (_, r1),
        running_server(second_manifest, policy=FixedComputePolicy()) as (_, r2),
    ):
        assert r1.keys.replica == "r1"
        assert r2.keys.replica == "r2"
        # the robot only knows the first replica's endpoint; the second is reached through it
        async with connected(port, "a") as ca, connected(port, "b") as cb, connected(port, "c") as cc:
            with anyio.fail_after(10):
                while len(servers := await ca.discover(app="fleet")) < 2:
                    pass  # the peers' mesh may take a moment to form
            assert [s.keys.replica for s in servers] == ["r1", "r2"]  # equal load: by name
            assert all(s.status.warmed_up and not s.status.draining for s in servers)
            on_r2 = await ca.open_session(servers[1], features=r2.info.features, fps=r2.info.fps)
            assert [s.keys.replica for s in await cb.discover(app="fleet")] == ["r1", "r2"]
            on_r1 = []
            for c in (cb, cc):
                (target,) = [s for s in await c.discover(app="fleet") if s.keys.replica == "r1"]
                on_r1.append(await c.open_session(target, features=r1.info.features, fps=r1.info.fps))
            servers = await ca.discover(app="fleet")
            assert [s.keys.replica for s in servers] == ["r2", "r1"]  # least loaded first
            assert [s.status.active_sessions for s in servers] == [1, 2]
            # a session on the far replica works end to end through the mesh
            result = await on_r2.infer(*observation(4), timeout=5)
            assert result.chunk_robot[0][0] == 4
            for session in (on_r2, *on_r1):
                await session.close()


async def test_health_is_503_until_warm_and_while_draining(port: int) -> None:
    health = free_port()
    policy = GatedPolicy()
    policy.armed = True  # warm-up blocks at the gate
    server = PolicyServer(server_manifest(port, ops=f"health_port = {health}"), policy=policy)
    started = anyio.Event()
    box: list[ServerReady] = []

    async def run() -> None:
        async with anyio.create_task_group() as inner:
            box.append(await inner.start(server.run))
            started.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        assert await anyio.to_thread.run_sync(policy.entered.wait, 10)
        assert await http_get(health, "/healthz") == (503, "starting\n")
        policy.entered.clear()
        policy.gate.set()
        with anyio.fail_after(10):
            await started.wait()
        policy.gate.clear()  # warm-up is over: from now on requests block at the gate
        assert await http_get(health, "/healthz") == (200, "serving\n")
        async with connected(port, "robot") as client:
            session = await open_on(client, box[0])
            seq = await session.send(*observation(3))
            assert await anyio.to_thread.run_sync(policy.entered.wait, 10)
            server.drain()  # while a request is in flight (its forward hangs at the gate)
            assert await http_get(health, "/healthz") == (503, "draining\n")
            # The client learns at once, while the forward still hangs: it can fail over now.
            with anyio.fail_after(5):
                await session.lost.wait()
            assert session.lost_reason == "server draining"
            assert not policy.gate.is_set()
            with pytest.raises(SessionLost):
                await session.receive(seq, timeout=1)
            policy.gate.set()
            with pytest.raises(SessionLost):
                await session.send(*observation(4))
            await session.close()


async def test_metrics_expose_the_documented_series(port: int) -> None:
    health = free_port()
    manifest = server_manifest(port, serving="max_sessions = 3", ops=f"health_port = {health}")
    async with running_server(manifest, policy=FixedComputePolicy()) as (_, ready):
        async with connected(port, "robot") as client:
            session = await open_on(client, ready)
            for i in range(3):
                await session.infer(*observation(i), timeout=5)
            # requests are counted just after their chunk is published: scrape until the third is in
            with anyio.fail_after(5):
                while 'servo_requests_total{outcome="ok"} 3.0' not in (text := (await http_get(health, "/metrics"))[1]):
                    pass
            await session.close()
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        assert samples["servo_active_sessions"] == 1
        assert samples["servo_max_sessions"] == 3
        assert samples["servo_warmed_up"] == 1
        assert samples["servo_draining"] == 0
        assert samples['servo_requests_total{outcome="ok"}'] == 3
        assert samples["servo_superseded_observations_total"] == 0
        assert samples["servo_sessions_opened_total"] == 1
        assert samples["servo_queue_wait_ms_count"] == 3
        assert samples["servo_inference_ms_count"] == 3
        assert any(name.startswith("servo_queue_wait_ms_bucket") for name in samples)
        assert any(name.startswith("servo_inference_ms_bucket") for name in samples)
        for series in (
            "servo_observations_rejected",
            "servo_control_rejected",
            "servo_unknown_session_notices",
            "servo_sessions_rejected",
            "servo_sessions_collected",
        ):
            assert f"# TYPE {series}_total counter" in text
        assert (await http_get(health, "/metrics"))[0] == 200
        assert (await http_get(health, "/nope"))[0] == 404
        assert (await http_get(health, "/metrics", method="POST"))[0] == 405
        assert (await http_get(health, "/healthz"))[0] == 200


async def test_audit_log_has_one_json_line_per_request(port: int, tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    manifest = server_manifest(port, ops=f'health_port = 0\naudit_log = "{audit}"')
    policy = FixedComputePolicy(compute_ms=5)  # a forward pass the log must account for
    async with running_server(manifest, policy=policy) as (_, ready), connected(port, "robot") as client:
        session = await open_on(client, ready)
        for i in range(4):
            await session.infer(*observation(i), timeout=5)
        await session.reset(2)
        await session.infer(*observation(9), timeout=5)
        with pytest.raises(ServerError, match="bad_observation"):
            await session.infer(*observation(1, dim=3), timeout=5)
        await session.close()
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert len(lines) == 6
    for line in lines:
        assert line["session_id"] == session.session_id
        assert line["client_id"] == "robot"
        for key in ("seq_id", "episode_id", "queue_wait_ms", "inference_ms", "outcome", "timestamp"):
            assert key in line, key
    assert [line["seq_id"] for line in lines] == [1, 2, 3, 4, 5, 6]
    assert [line["episode_id"] for line in lines] == [0, 0, 0, 0, 2, 2]
    assert [line["outcome"] for line in lines] == ["ok"] * 5 + ["bad_observation"]
    assert all(line["inference_ms"] >= 0 and line["queue_wait_ms"] >= 0 for line in lines)
    assert all(line["inference_ms"] >= 5 for line in lines if line["outcome"] == "ok")


async def test_busy_health_port_error_names_the_port() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        held = other.getsockname()[1]
        endpoint = OpsEndpoint(lambda: (True, "serving"), lambda: b"")
        with pytest.raises(OSError, match=f"health port {held} on 127.0.0.1: Address already in use"):
            await endpoint.run("127.0.0.1", held)


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other end closed ``sock`` (never waits)."""
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


async def test_connections_that_send_nothing_hold_at_most_max_connections_of_the_endpoint() -> None:
    """Review of issue 29: every connection was held for its 5 s deadline, however many: a stranger
    opening connections and sending nothing held as many of the process's file descriptors."""

    async def ok(path: str, params: dict[str, str]) -> Response:
        return text(200, "ok\n")

    endpoint = HttpEndpoint(ok, what="test port")
    extra = 8
    async with anyio.create_task_group() as tg:
        port = await tg.start(endpoint.run, "127.0.0.1", 0)
        held = []
        try:
            for _ in range(MAX_CONNECTIONS + extra):
                sock = socket.create_connection(("127.0.0.1", port))
                sock.setblocking(False)
                held.append(sock)

            def served() -> list[object]:
                return [
                    c
                    for c in psutil.Process().net_connections("tcp")
                    if c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED
                ]

            # Until the endpoint took them all in, or turned the ones over its bound away.
            await eventually(
                lambda: sum(map(closed_by_peer, held)) >= extra or len(served()) >= len(held),
                30,
                "the endpoint accepting every connection",
            )
            assert len(served()) <= MAX_CONNECTIONS
        finally:
            for sock in held:
                sock.close()
            tg.cancel_scope.cancel()
