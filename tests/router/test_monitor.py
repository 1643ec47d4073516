"""servo-monitor behind a real mTLS router, as the fleet's ``monitor`` identity: it sees the robot's
signed telemetry, the replica's status and the robot's requests from the replica's audit, and
exports them to Prometheus, with nothing but a monitor's rights."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from servo._core import ServerIdentity
from servo.edge.remote import RemoteEngine
from servo.edge.runtime import RunOptions
from servo.edge.telemetry import TelemetryPublisher
from servo.identity import load_identity
from servo.monitor import MonitorConfig, MonitorReady, run_monitor
from servo.router import load_fleet, run_router
from servo.server.manifest import parse_manifest
from servo.wire import fingerprint
from tests.edge.harness import edge_config, running_edge, small_sim
from tests.router.harness import Credentials, fleet_toml
from tests.support import free_port, running_server

pytestmark = pytest.mark.anyio


async def http_json(port: int, path: str) -> object:
    return json.loads(await http_text(port, path))


async def http_text(port: int, path: str) -> str:
    with anyio.fail_after(10):
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
            data = b""
            try:
                while True:
                    data += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.split()[1] == b"200", head
    return body.decode()


def manifest(creds: Credentials, port: int, operator: bytes) -> str:
    gpu = creds.leaves["gpu-0"]
    return f"""
[model]
source = "reference"
warmup = 1
[model.options]
cameras = {{front = [48, 64]}}
[serving]
replica = "gpu-0-r0"
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
[security]
operators = [{{name = "dashboard", identity = "{fingerprint(operator)}"}}]
"""


async def test_the_monitor_sees_the_fleet_with_a_monitors_rights(creds: Credentials, tmp_path: Path) -> None:
    port = free_port()
    fleet_file = tmp_path / "fleet.toml"
    fleet_file.write_text(fleet_toml("mtls", port, creds.pki, None))
    robot_key = ServerIdentity.from_seed(bytes(32))
    pins = tmp_path / "robot-keys"
    pins.write_text(f"# enrolled robots\nrobot-7 {fingerprint(robot_key.public_key)}\n")
    r7, dashboard = creds.leaves["robot-7"], creds.leaves["dashboard"]
    operator = load_identity(tmp_path / "monitor.key", role="operator")
    async with anyio.create_task_group() as tg:
        await tg.start(run_router, load_fleet(fleet_file))
        async with running_server(parse_manifest(manifest(creds, port, operator.public_key))) as (_, ready):
            monitor_config = MonitorConfig(
                connect=[f"tls/127.0.0.1:{port}"],
                tls_root_ca=creds.pki.ca,
                tls_cert=dashboard.cert,
                tls_key=dashboard.key,
                http_port=0,
                robot_keys=str(pins),
                trusted_servers=[ready.fingerprint],
                identity_key=str(tmp_path / "monitor.key"),
                state_file=str(tmp_path / "monitor.state"),
            )
            ready_monitor: MonitorReady = await tg.start(run_monitor, monitor_config)
            http = ready_monitor.http_port
            sim = small_sim()
            config = edge_config(
                port,
                connect=[f"tls/127.0.0.1:{port}"],
                tls_root_ca=creds.pki.ca,
                tls_cert=r7.cert,
                tls_key=r7.key,
            )
            engine = RemoteEngine(config, sim.spec())
            options = RunOptions(telemetry=TelemetryPublisher(robot_key, period_s=0.2))
            async with running_edge(sim, engine, options) as run:
                with anyio.fail_after(30):
                    while True:
                        fleet = await http_json(http, "/api/fleet")
                        assert isinstance(fleet, dict)
                        robots = {r["id"]: r for r in fleet["robots"]}
                        streaming = "robot-7" in robots and robots["robot-7"]["state"] == "streaming"
                        # The replicas' status is polled once a second: it shows the session a moment later.
                        if streaming and [r["sessions"] for r in fleet["replicas"]] == [1]:
                            break
                        await anyio.sleep(0.2)
                robot = robots["robot-7"]
                assert robot["replica"] == ready.keys.replica == "gpu-0-r0"
                assert robot["pinned"] is True
                assert robot["fingerprint"] == fingerprint(robot_key.public_key)
                (replica,) = fleet["replicas"]
                assert (replica["replica"], replica["up"], replica["sessions"]) == ("gpu-0-r0", True, 1)
                timeline = await http_json(http, "/api/robot?id=robot-7")
                assert isinstance(timeline, dict)
                assert [t["state"] for t in timeline["transitions"]][:2] == ["connecting", "streaming"]
                requests = timeline["requests"]
                assert requests
                assert {r["replica"] for r in requests} == {"gpu-0-r0"}
                assert all(r["outcome"] == "ok" and r["staleness_ms"] >= r["inference_ms"] for r in requests)
                metrics = await http_text(http, "/metrics")
                assert 'servo_edge_state{robot="robot-7",state="streaming"} 1.0' in metrics
                assert 'servo_fleet_replica_up{app="default",model="servo-reference",replica="gpu-0-r0"} 1.0' in metrics
                await run.stop()
        tg.cancel_scope.cancel()
