"""Nothing is exposed by accident, and what an operator exposes on purpose still moves no robot.

Issue 18: a peer-mode server beside the router also listened on a plain TCP port, without a word;
a peer with no certificate connected there, read robot-7's traffic, forced 15 re-handshakes and
drove it for 207 ticks, although robot-7 itself sat behind the mTLS router. Now ``servo-serve``
refuses to listen while connected to a router, and to listen in plain text on a non-loopback
address, each unless asked explicitly (and ``servo-edge`` to connect in plain text to another
host); and even through such a bypass, the session layer holds: forged chunks, forged notices and
a rogue replica with its own identity cost robot-7 nothing.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import anyio
import msgspec
import numpy as np
import pytest
import zenoh

from conftest import PRIVATE_LAN_ADDRESS
from servo._core import ServerIdentity
from servo.client import PolicyClient
from servo.router import Fleet, load_fleet, run_router
from servo.server.manifest import parse_manifest
from servo.transport import ZenohSettings
from servo.wire import ServerKeys
from tests.edge.harness import Proc
from tests.router.harness import Credentials, fleet_toml
from tests.router.test_e2e import _manifest as mtls_server_manifest
from tests.security.notice_peers import NoticeForger
from tests.security.peers import (
    ChunkForger,
    EdgeRig,
    RogueReplica,
    Tap,
    closing,
    edge_rig,
    sim_policy_spec,
)
from tests.server.policies import FixedComputePolicy
from tests.support import eventually, free_port, running_server

pytestmark = pytest.mark.anyio

REQUEST_TIMEOUT_S = 5.0
FORGED = 12.5
HOSTILE = 66.6
OBS = "@servo/*/*/*/c/robot-7/obs"


@pytest.fixture(scope="module")
def creds(tmp_path_factory: pytest.TempPathFactory) -> Credentials:
    return Credentials(tmp_path_factory.mktemp("fleet"))


def serve(manifest: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "servo.cli.serve", str(manifest), "--log-level", "warning", *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def refusal(manifest: Path, *flags: str) -> str:
    """The one line ``servo-serve`` refuses to start with (exit 2)."""
    done = serve(manifest, *flags)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("servo-serve: error: ")
    return line


@pytest.mark.parametrize("listen", [True, False], ids=["listening", "peer mode, no listen"])
def test_a_server_beside_a_router_is_refused_in_one_line(tmp_path: Path, listen: bool) -> None:
    """Peers reaching a listen endpoint bypass the router's ACL; and with no listen endpoint at
    all, a peer still dials every peer the router gossips about (a fleet member in peer mode with
    a listen endpoint of its own read robot-7's chunks that way)."""
    listening = f'["tcp/127.0.0.1:{free_port()}"]' if listen else "[]"
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(
        f'[model]\nsource = "reference"\n[zenoh]\nmode = "peer"\nlisten = {listening}\n'
        f'connect = ["tcp/127.0.0.1:{free_port()}"]\n[ops]\nhealth_port = 0\n'
    )
    line = refusal(manifest)
    assert ("zenoh.listen" if listen else "zenoh.mode") in line
    assert "access control" in line
    assert 'mode = "client"' in line
    assert "--listen-beside-router" in line


@pytest.mark.wildcard
def test_a_plain_listen_on_the_network_is_refused_unless_insecure(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.toml"
    manifest.write_text('[model]\nsource = "reference"\nwarmup = 0\n[ops]\nhealth_port = 0\n')
    line = refusal(manifest, "--listen", f"tcp/0.0.0.0:{free_port()}")
    assert "zenoh.listen[0]" in line
    assert "not TLS and not loopback" in line
    assert "--insecure" in line
    server = Proc(
        [sys.executable, "-m", "servo.cli.serve", str(manifest), "--listen", f"tcp/0.0.0.0:{free_port()}", "--insecure"]
    )
    try:
        server.wait_line("ready", 120)
        assert "anyone on it reads every robot's traffic" in server.output
    finally:
        server.stop()


def test_an_edge_refuses_plain_text_to_another_host_in_one_line() -> None:
    command = [sys.executable, "-m", "servo.cli.edge", "--robot", "sim", "--connect", "tcp/10.0.0.1:7447"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "connect[0] = 'tcp/10.0.0.1:7447'" in line
    assert "--insecure" in line


def manifest_beside(creds: Credentials, router_port: int, bypass_port: int) -> str:
    """robot-7's server behind the mTLS router (as in tests/router), in peer mode, also listening
    in plain TCP on ``bypass_port``: the set-up of issue 18, allowed explicitly."""
    behind_router = mtls_server_manifest(creds, router_port)
    return (
        behind_router.replace('mode = "client"', f'mode = "peer"\nlisten = ["tcp/127.0.0.1:{bypass_port}"]')
        + '[serving]\nreplica = "r-real"\n[security]\nlisten_beside_router = true\n'
    )


def mtls_fleet(creds: Credentials, router_port: int, tmp_path: Path) -> Fleet:
    """The test fleet behind an mTLS router on ``router_port``."""
    fleet_file = tmp_path / "fleet.toml"
    fleet_file.write_text(fleet_toml("mtls", router_port, creds.pki, None))
    return load_fleet(fleet_file)


def robot7_rig(creds: Credentials, router_port: int, tmp_path: Path) -> AbstractAsyncContextManager[EdgeRig]:
    """robot-7's edge, a client of the router with its certificate."""
    robot7 = creds.leaves["robot-7"]
    return edge_rig(
        router_port,
        tmp_path,
        connect=[f"tls/127.0.0.1:{router_port}"],
        tls_root_ca=creds.pki.ca,
        tls_cert=robot7.cert,
        tls_key=robot7.key,
    )


async def test_through_a_bypass_a_peer_still_cannot_drive_or_stall_a_robot(creds: Credentials, tmp_path: Path) -> None:
    """The operator allowed the bypass (``listen_beside_router``); a peer with no certificate joins
    there and attacks robot-7, which sits behind the mTLS router."""
    router_port, bypass_port = free_port(), free_port()
    policy = FixedComputePolicy(compute_ms=30, **sim_policy_spec(chunk_size=20))
    async with anyio.create_task_group() as tg:
        await tg.start(run_router, mtls_fleet(creds, router_port, tmp_path))
        async with (
            running_server(parse_manifest(manifest_beside(creds, router_port, bypass_port)), policy) as (server, ready),
            robot7_rig(creds, router_port, tmp_path) as rig,
        ):
            await eventually(lambda: rig.engine.chunks_received >= 3, 30, "robot-7 streaming through the router")
            first = rig.engine.session
            bypass = ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{bypass_port}"])
            async with PolicyClient.connect(bypass, "mallory") as mallory:
                z = mallory.zsession
                forgers = [
                    NoticeForger(z, OBS, repeat=4),
                    ChunkForger(z, OBS, FORGED),
                    ChunkForger(z, OBS, FORGED, secret=bytes(range(32))),
                    RogueReplica(
                        z,
                        ServerKeys(ready.keys.app, ready.keys.model, "a-rogue"),
                        chunks=lambda seq: np.full((20, 6), HOSTILE, np.float32),
                        identity=ServerIdentity.generate(),
                    ),
                ]
                with closing(*forgers):
                    attack_started = time.monotonic_ns()
                    await eventually(lambda: forgers[0].forged >= 20, 30, "the bypass peer sees robot-7's observations")
                    assert rig.engine.session is first  # forged notices forced no re-handshake
                    (session,) = server.registry.snapshot()
                    server.state.collect(session, "idle")  # the server drops it: a re-handshake, the rogue in sight
                    await eventually(lambda: rig.engine.session not in (first, None), 15, "re-opened")
                    (reopened,) = await server.wait_sessions(lambda sessions: len(sessions) == 1)
                    received = rig.engine.chunks_received
                    await eventually(lambda: rig.engine.chunks_received >= received + 5, 30, "streaming again")
                    attack_ended = time.monotonic_ns()
        tg.cancel_scope.cancel()
    assert rig.summary.final_state == "streaming"
    merged = rig.merges.merges
    assert not any(np.isclose(m.chunk_robot, FORGED).any() or np.isclose(m.chunk_robot, HOSTILE).any() for m in merged)
    assert {m.session_id for m in merged} <= {session.session_id, reopened.session_id}  # the real server's only
    assert rig.merges.longest_gap_s(attack_started, attack_ended) < REQUEST_TIMEOUT_S


async def test_a_fleet_member_in_peer_mode_gets_no_link_to_a_server_behind_the_router(
    creds: Credentials, tmp_path: Path
) -> None:
    """The set-up the refusals lead to (the server a client of the mTLS router): robot-8, with a
    valid fleet certificate, joins in peer mode with a plain listen endpoint of its own, so the
    router's gossip names it to every peer. No member links to it: it reads none of robot-7's
    traffic, and its forged chunks never reach robot-7, which keeps streaming."""
    router_port = free_port()
    policy = FixedComputePolicy(compute_ms=30, **sim_policy_spec(chunk_size=20))
    robot8 = msgspec.structs.replace(
        creds.mtls("robot-8", router_port), mode="peer", listen=[f"tcp/127.0.0.1:{free_port()}"]
    )
    async with anyio.create_task_group() as tg:
        await tg.start(run_router, mtls_fleet(creds, router_port, tmp_path))
        async with (
            running_server(parse_manifest(mtls_server_manifest(creds, router_port)), policy),
            robot7_rig(creds, router_port, tmp_path) as rig,
            PolicyClient.connect(robot8, "robot-8") as mallory,
        ):
            await eventually(lambda: rig.engine.chunks_received >= 3, 30, "robot-7 streaming through the router")
            tap = Tap(mallory.zsession, "@servo/*/*/*/c/robot-7/**")
            forger = ChunkForger(mallory.zsession, OBS, FORGED)
            with closing(tap, forger):
                attack_started = time.monotonic_ns()
                received = rig.engine.chunks_received
                await eventually(lambda: rig.engine.chunks_received >= received + 10, 30, "streaming through it")
                attack_ended = time.monotonic_ns()
                assert list(mallory.zsession.info.peers_zid()) == []  # nobody dialled the peer
                assert tap.seen == []  # not one of robot-7's observations or chunks
        tg.cancel_scope.cancel()
    assert rig.summary.final_state == "streaming"
    assert not any(np.isclose(m.chunk_robot, FORGED).any() for m in rig.merges.merges)
    assert rig.merges.longest_gap_s(attack_started, attack_ended) < REQUEST_TIMEOUT_S


@pytest.mark.wildcard
def test_health_off_loopback_is_refused_in_one_line_unless_expose_health(tmp_path: Path) -> None:
    """Issue 29: ``health_host = "0.0.0.0"`` needed no flag, and /metrics names the robots."""
    manifest = tmp_path / "manifest.toml"
    health_port = free_port()
    manifest.write_text(
        f'[model]\nsource = "reference"\nwarmup = 0\n[zenoh]\nlisten = ["tcp/127.0.0.1:{free_port()}"]\n'
        f'[ops]\nhealth_host = "0.0.0.0"\nhealth_port = {health_port}\n'
    )
    line = refusal(manifest)
    assert "ops.health_host = '0.0.0.0'" in line
    assert "anyone on the network would read /metrics" in line
    assert "--expose-health" in line
    accepted = Proc([sys.executable, "-m", "servo.cli.serve", str(manifest), "--expose-health"])
    try:
        accepted.wait_line("ready", 120)
        # Exposed as asked: reachable at this host's LAN address, not only on loopback.
        with urllib.request.urlopen(f"http://{PRIVATE_LAN_ADDRESS}:{health_port}/healthz", timeout=30) as reply:
            assert reply.status == 200
    finally:
        accepted.stop()


def test_a_servers_plain_connect_to_another_host_is_refused_unless_insecure(tmp_path: Path) -> None:
    """Issue 29: the edge refused a plain connect to another host; the server did not."""
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(
        '[model]\nsource = "reference"\nwarmup = 0\n[zenoh]\nmode = "client"\nlisten = []\n'
        'connect = ["tcp/10.0.0.1:7447"]\n[ops]\nhealth_port = 0\n'
    )
    line = refusal(manifest)
    assert "zenoh.connect[0] = 'tcp/10.0.0.1:7447'" in line
    assert "not TLS and not loopback" in line
    assert "--insecure" in line


def test_an_edge_in_peer_mode_behind_a_router_is_refused_unless_asked() -> None:
    """Issue 29: an edge in ``--zenoh-mode peer`` behind the router was accepted, and a second
    robot got a direct plain link to it and 18 of its observations."""
    router_port = free_port()
    router = zenoh.open(ZenohSettings(mode="router", listen=[f"tcp/127.0.0.1:{router_port}"]).to_config())
    try:
        command = [
            sys.executable,
            *("-m", "servo.cli.edge", "--robot", "sim", "--no-status", "--log-level", "error"),
            *("--zenoh-mode", "peer", "--connect", f"tcp/127.0.0.1:{router_port}", "--connect-timeout-s", "5"),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    finally:
        router.close()
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "link.zenoh_mode = 'peer'" in line
    assert "is a router" in line
    assert "--peer-beside-router" in line
