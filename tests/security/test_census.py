"""The exposure census: every socket and every Zenoh declaration is in the threat model, and guarded.

A server (loopback default, and the CLI's suggested LAN set-up ``tls/0.0.0.0`` with the openpi door
off loopback), a robot, a monitor and a router run in this process; the census lists what they
listen on (from the operating system), what they declare (`tests.security.census`) and what
files they keep in servo's directory and the robot's own, and checks each against
`servo.threat_model` (every file this user's alone, no link). Then a stranger, with nothing but
what the network shows it (the self-signed certificate, the keys it sees), uses each door whose
row says strangers are refused, and is refused. The security guide's table is the threat
model's, row for row.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import numpy as np
import psutil
import pytest
import zenoh
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import InvalidStatus

from servo.cli.console import Console
from servo.cli.listen import secure_listen
from servo.cli.robots import main as robots_cli
from servo.client import ServerError, SessionRejected
from servo.client.audit import ask_audit
from servo.edge.telemetry import TelemetryPublisher
from servo.frontends import frontends_of
from servo.home import config_dir
from servo.identity import load_identity, operator_identity
from servo.monitor import MonitorConfig, run_monitor
from servo.monitor.service import MonitorReady
from servo.router import load_fleet, run_router
from servo.server.manifest import parse_manifest
from servo.server.service import PolicyServer, ServerReady
from servo.threat_model import DOORS, Door, markdown_table
from servo.transport import query
from servo.wire import AuditQuery, EdgeTelemetry, Rejection, decode, fingerprint, seal_telemetry, telemetry_key
from tests.frontends.helpers import aloha_obs, blocking
from tests.router.harness import Credentials, fleet_toml
from tests.security.census import Census, as_component, file_row, kept_files, listening_ports, unix_sockets
from tests.security.lan import certificate_of, lan_client, robot_files
from tests.security.peers import ChunkForger, EdgeRig, closing, edge_rig
from tests.server.helpers import metric, open_on, sample
from tests.support import eventually, free_port

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"),
]
SECURITY_GUIDE = Path(__file__).parents[2] / "docs" / "guides" / "security.md"
FORGED = 12.5


def socket_row(setting: str) -> Door:
    (door,) = [d for d in DOORS if d.kind == "socket" and d.where.startswith(setting)]
    return door


def manifest_text(lan: bool, port: int, health: int, audit_log: Path) -> str:
    listen = f"tls/0.0.0.0:{port}" if lan else f"tcp/127.0.0.1:{port}"
    door = "0.0.0.0:0" if lan else "127.0.0.1:0"
    return (
        f'[model]\nsource = "tests.security.peers:make_sim_policy"\nwarmup = 1\n[zenoh]\nlisten = ["{listen}"]\n'
        f'[ops]\nhealth_port = {health}\naudit_log = "{audit_log}"\n[frontends.openpi]\nlisten = "{door}"\n'
    )


@contextlib.asynccontextmanager
async def fleet(
    lan: bool, tmp_path: Path, census: Census
) -> AsyncIterator[tuple[PolicyServer, ServerReady, EdgeRig, MonitorReady, dict[int, Door]]]:
    """Server (with its openpi door), a robot and a monitor that knows its key; yields them and the sockets they own."""
    port, health = free_port(), free_port()
    manifest, _ = secure_listen(parse_manifest(manifest_text(lan, port, health, tmp_path / "audit.jsonl")))
    # Built by its policy process, as servo-serve runs it (model.process = "separate").
    server = PolicyServer(manifest, frontends=frontends_of(manifest))
    scheme = "tls" if lan else "tcp"
    async with anyio.create_task_group() as tg:
        async with contextlib.AsyncExitStack() as stack:
            with as_component("servo-serve"):
                ready: ServerReady = await tg.start(server.run)
            stack.callback(server.drain)
            edge = {"connect": [f"{scheme}/127.0.0.1:{port}"], **robot_files(tmp_path, "robot-7")}
            if lan:
                edge["join"] = ready.join_token
            robot = load_identity(edge["identity_key"], role="robot")
            # The robot reports to the monitor (whose identity is made where servo-monitor makes it).
            telemetry = TelemetryPublisher(robot, period_s=0.2, readers=[operator_identity().public_key])
            with as_component("servo-edge"):
                rig = await stack.enter_async_context(edge_rig(port, tmp_path, "robot-7", telemetry=telemetry, **edge))
            (tmp_path / "robot-keys").write_text(f"robot-7 {fingerprint(robot.public_key)}\n")
            monitor = MonitorConfig(
                connect=[f"{scheme}/127.0.0.1:{port}"],
                tls_root_ca=certificate_of(server) if lan else "",
                http_port=0,
                robot_keys=str(tmp_path / "robot-keys"),
            )
            with as_component("servo-monitor"):
                watching = await tg.start(run_monitor, monitor)
            await eventually(lambda: rig.engine.chunks_received >= 2, 30, "the robot streaming")
            with anyio.fail_after(30):  # the monitor shows the robot it knows, from its telemetry
                while "robot-7" not in {r["id"] for r in json.loads(await fetch(watching, "api/fleet"))["robots"]}:  # noqa: ASYNC110 - no event
                    await anyio.sleep(0.05)
            sockets = {
                (port, "tcp"): socket_row("zenoh.listen"),
                (health, "tcp"): socket_row("ops.health_host"),
                (int(ready.frontends["openpi"].rsplit(":", 1)[1]), "tcp"): socket_row("frontends.openpi.listen"),
                (watching.http_port, "tcp"): socket_row("--http-host"),
            }
            if lan:  # QUIC beside TLS: the server's twin of its listen port, and the robot's dial of it
                sockets[(port, "udp")] = socket_row("zenoh.listen")

                def dials() -> set[tuple[int, str]]:
                    return {(p, kind) for p, kind in listening_ports() if kind == "udp" and p != port}

                # Another test's QUIC sockets may linger a moment after their sessions closed.
                await eventually(lambda: len(dials()) == 1, 10, "one UDP socket besides the server's: the robot's")
                sockets |= dict.fromkeys(dials(), socket_row("its quic/ dial"))
            yield server, ready, rig, watching, sockets
        tg.cancel_scope.cancel()


def check_policy_link(ready: ServerReady) -> tuple[str, str, str]:
    """The policy process holds one socket, the anonymous half of its link: nothing to connect to."""
    pid = ready.policy_pid
    assert pid is not None
    assert unix_sockets(pid) == [("", False)]
    assert not psutil.Process(pid).net_connections(kind="inet")
    return ("servo-serve", "socket", socket_row("model.process").where)


def check_census(census: Census, sockets: dict[tuple[int, str], Door], *, loopback_only: bool) -> None:
    assert census.unmatched() == []
    listening = listening_ports()
    assert listening == set(sockets), f"sockets the threat model does not name: {listening - set(sockets)}"
    if loopback_only:
        assert all(kind == "tcp" for _, kind in listening)  # QUIC only beside tls/
        addresses = {c.laddr.ip for c in psutil.Process().net_connections("inet") if c.status == psutil.CONN_LISTEN}
        assert addresses == {"127.0.0.1"}
    for child in psutil.Process().children(recursive=True):  # the robot's control process
        assert [c for c in child.net_connections("inet") if c.status == "LISTEN"] == []


def check_files(*directories: Path) -> set[tuple[str, str, str]]:
    """Every file kept is in the threat model, a regular file of this user's, readable by nobody else.

    Returns the rows checked (no other user may read or write those files).
    """
    rows = set()
    for directory in directories:
        kept = kept_files(directory)
        assert kept, f"{directory} holds nothing: the census looked in the wrong place"
        for relative, path in kept.items():
            door = file_row(relative)
            assert door is not None, f"a file the threat model does not name: {relative}"
            rows.add((door.component, door.kind, door.where))
            info = path.lstat()
            assert stat.S_ISREG(info.st_mode), f"{relative} is no regular file"
            assert info.st_uid == os.geteuid()
            assert stat.S_IMODE(info.st_mode) & 0o077 == 0, f"{relative}: mode {stat.S_IMODE(info.st_mode):04o}"
        for folder in [directory, *(p for p in directory.rglob("*") if p.is_dir() and not p.is_symlink())]:
            assert stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0, f"{folder}: others may use it"
    return rows


def check_placed(audit_log: Path, rig: EdgeRig) -> set[tuple[str, str, str]]:
    """The files servo writes where the operator says: created readable by this user alone."""
    rows = set()
    placed = {"[ops] audit_log": audit_log, "--record PATH": rig.record, "--summary PATH": rig.summary_file}
    for where, path in placed.items():
        (door,) = [d for d in DOORS if d.kind == "file" and d.where == where]
        assert stat.S_IMODE(path.lstat().st_mode) == 0o600, f"{path}: mode {stat.S_IMODE(path.lstat().st_mode):04o}"
        rows.add((door.component, door.kind, door.where))
    return rows


async def openpi_client(port: int, key: str | None, *, tls: bool) -> float:
    uri = f"{'wss' if tls else 'ws'}://127.0.0.1"

    def run() -> float:
        client = WebsocketClientPolicy(uri, port, api_key=key)
        try:
            return float(client.infer(aloha_obs(2.0, size=(48, 64)))["actions"][0][0])
        finally:
            client._ws.close()

    return await blocking(run)


async def test_the_loopback_quick_start_exposes_only_what_the_threat_model_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    census = Census()
    census.install(monkeypatch)
    async with fleet(False, tmp_path, census) as (_server, ready, _rig, _monitor, sockets):
        port = int(ready.frontends["openpi"].rsplit(":", 1)[1])
        assert await openpi_client(port, None, tls=False) == pytest.approx(2.0)  # its sessions declare too
        check_census(census, sockets, loopback_only=True)
    assert {d.component for d in census.declarations} == {"servo-serve", "servo-edge", "servo-monitor"}
    check_files(config_dir(), tmp_path / "robot-7")
    assert {"monitor.key", "monitor.state", "telemetry.run", "servers/default.key"} <= set(kept_files(config_dir()))


@pytest.mark.wildcard
async def test_a_lan_server_exposes_only_what_the_threat_model_names_and_strangers_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    census = Census()
    census.install(monkeypatch)
    assert robots_cli(["api-key", "lab-pc"], Console(live=False)) == 0
    key = capsys.readouterr().out.strip()
    async with fleet(True, tmp_path, census) as (server, ready, rig, monitor, sockets):
        door_port = int(ready.frontends["openpi"].rsplit(":", 1)[1])
        openpi = server.manifest.frontends.openpi
        assert openpi is not None
        monkeypatch.setenv("SSL_CERT_FILE", openpi.certificate)
        assert await openpi_client(door_port, key, tls=True) == pytest.approx(2.0)
        check_census(census, sockets, loopback_only=False)
        zenoh_port = next(p for (p, _), d in sockets.items() if d.where.startswith("zenoh.listen"))
        refused = await strangers(server, ready, rig, monitor, zenoh_port, door_port, tmp_path)
        (dial,) = [p for (p, _), d in sockets.items() if d.where.startswith("its quic/")]
        received = rig.engine.chunks_received
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as garbage:
            for _ in range(200):  # what a stranger can send the robot's QUIC socket: datagrams
                garbage.sendto(os.urandom(1200), ("127.0.0.1", dial))
        await eventually(lambda: rig.engine.chunks_received >= received + 3, 30, "the robot streaming on")
        refused.add(("servo-edge", "socket", socket_row("its quic/ dial").where))
        refused.add(check_policy_link(ready))
    refused |= check_files(config_dir(), tmp_path / "robot-7")
    refused |= check_placed(tmp_path / "audit.jsonl", rig)
    assert {"servers/default.roster", "tls/server.key"} <= set(kept_files(config_dir()))
    assert rig.summary is not None
    assert not any(np.isclose(m.chunk_robot, FORGED).any() for m in rig.merges.merges)
    guarded = {(d.component, d.kind, d.where) for d in DOORS if d.stranger_refused and d.component == "servo-serve"}
    guarded |= {("servo-edge", "subscriber", "@servo/*/*/*/c/*/action")}
    guarded |= {("servo-edge", "socket", socket_row("its quic/ dial").where)}
    guarded |= {("servo-monitor", "subscriber", "@servo/@robots/*/telemetry")}
    assert guarded <= refused


async def fetch(monitor: MonitorReady, path: str) -> bytes:
    """A page of the monitor's, fetched off the event loop (the monitor runs on it)."""

    def get() -> bytes:
        with urllib.request.urlopen(f"{monitor.url}{path}", timeout=5) as response:
            return bytes(response.read())

    return await anyio.to_thread.run_sync(get)


async def monitor_refused(monitor: MonitorReady) -> set[str]:
    """The reasons the monitor refused telemetry for, from its /metrics."""
    exposition = await fetch(monitor, "metrics")
    reasons = ("identity_changed", "unknown_robot")
    return {r for r in reasons if sample(exposition, "servo_monitor_telemetry_refused_total", reason=r) > 0}


def observations_rejected(server: PolicyServer) -> float:
    reasons = ("header", "session", "mac", "too_large")
    return sum(metric(server, "servo_observations_rejected_total", reason=r) for r in reasons)


async def strangers(
    server: PolicyServer,
    ready: ServerReady,
    rig: EdgeRig,
    monitor: MonitorReady,
    zenoh_port: int,
    door_port: int,
    tmp_path: Path,
) -> set[tuple[str, str, str]]:
    """Mallory uses every guarded door of the LAN set-up; the rows whose use was refused."""
    refused: set[tuple[str, str, str]] = set()

    def row(component: str, kind: str, key: str) -> None:
        door = next(d for d in DOORS if (d.component, d.kind) == (component, kind) and d.where == key)
        refused.add((door.component, door.kind, door.where))

    async with lan_client(server, zenoh_port, tmp_path, "mallory") as mallory:
        with pytest.raises(SessionRejected, match="is not enrolled"):
            await open_on(mallory, ready)
        row("servo-serve", "socket", socket_row("zenoh.listen").where)
        row("servo-serve", "queryable", "@servo/*/*/*/c/*/session")
    async with lan_client(server, zenoh_port, tmp_path, "mallory", quic=True) as over_quic:  # the listen's QUIC twin
        with pytest.raises(SessionRejected, match="is not enrolled"):
            await open_on(over_quic, ready)
    async with lan_client(server, zenoh_port, tmp_path, "mallory") as mallory:
        z = mallory.zsession
        (legacy,) = await query(z, f"{ready.keys.prefix}/session", payload=b"\x80", timeout=5)
        assert legacy.err is not None
        assert decode(legacy.err.payload.to_bytes(), Rejection).code == "schema_version"
        row("servo-serve", "queryable", "@servo/*/*/*/session")
        (control,) = await query(z, ready.keys.client("robot-7").control, payload=b"close", timeout=5)
        assert control.err is not None
        assert decode(control.err.payload.to_bytes(), Rejection).code in ("unauthenticated", "unknown_session")
        row("servo-serve", "queryable", "@servo/*/*/*/c/*/control")
        rejected = observations_rejected(server)
        obs = ready.keys.client("robot-7").obs
        forger = ChunkForger(z, obs, FORGED, secret=bytes(range(32)))
        with closing(forger):
            await eventually(lambda: forger.forged >= 3, 30, "forged chunks sent at robot-7")
            for _ in range(3):
                z.put(obs, b"\x00" * 64, attachment=b"\x01" * 62)
            await eventually(lambda: observations_rejected(server) >= rejected + 3, 15, "garbage observations dropped")
            client = rig.engine.client
            assert client is not None
            await eventually(lambda: sum(client.counters.chunks_rejected.values()) >= 1, 15, "forged chunks dropped")
        row("servo-serve", "subscriber", "@servo/*/*/*/c/*/obs")
        row("servo-edge", "subscriber", "@servo/*/*/*/c/*/action")
        (info,) = [s for s in await mallory.discover() if s.keys == ready.keys]
        with pytest.raises(ServerError, match="is no operator of this replica"):
            await ask_audit(z, ready.keys, info.status, mallory.identity, AuditQuery("robot-7"), timeout=5)
        row("servo-serve", "queryable", "@servo/*/*/*/audit")
        with pytest.raises(ServerError, match="is not enrolled on this server"):
            await mallory.fetch_trajectory(info, "")
        row("servo-serve", "queryable", "@servo/*/*/*/trajectory")
        for robot in ("robot-7", "mallory"):  # an enrolled robot's name, and one nobody enrolled
            record = EdgeTelemetry(robot, 1, 0, 1000.0, "streaming")
            body, attachment = seal_telemetry(record, mallory.identity, [mallory.identity.public_key])
            z.put(telemetry_key(robot), body, attachment=attachment)
        with anyio.fail_after(15):  # the monitor refuses both, by their reasons (its /metrics, off the loop)
            while await monitor_refused(monitor) != {"identity_changed", "unknown_robot"}:  # noqa: ASYNC110 - no event
                await anyio.sleep(0.05)
        row("servo-monitor", "subscriber", "@servo/@robots/*/telemetry")

    def no_key() -> int:
        with pytest.raises(InvalidStatus) as caught:
            WebsocketClientPolicy("wss://127.0.0.1", door_port)
        return caught.value.response.status_code

    assert await blocking(no_key) == 401
    row("servo-serve", "socket", socket_row("frontends.openpi.listen").where)
    return refused


async def test_the_router_listens_only_where_its_fleet_file_says_and_refuses_strangers(tmp_path: Path) -> None:
    creds = Credentials(tmp_path)
    port = free_port()
    fleet_file = tmp_path / "fleet.toml"
    fleet_file.write_text(fleet_toml("mtls", port, creds.pki, None))
    async with anyio.create_task_group() as tg:
        await tg.start(run_router, load_fleet(fleet_file))
        # A test before may have closed QUIC sockets that Zenoh releases a moment later.
        await eventually(lambda: listening_ports() == {(port, "tcp")}, 10, "only the router's listen port")
        assert socket_row("[router] listen").component == "servo-router"
        stranger = creds.mtls("robot-7", port)
        no_certificate = stranger.to_config()
        no_certificate.insert_json5("transport/link/tls/enable_mtls", "false")
        with pytest.raises(zenoh.ZError):
            zenoh.open(no_certificate).close()
        tg.cancel_scope.cancel()


def test_the_security_guide_table_is_the_threat_model() -> None:
    assert markdown_table() in SECURITY_GUIDE.read_text()
