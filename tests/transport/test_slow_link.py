"""A real slow link: the server in a network namespace behind a veth shaped to 100 Mbit/s.

The edge side runs in this process on the host; ``servo-serve`` runs in the namespace, so every
observation crosses the veth and its token-bucket filter (shared memory off on both ends: Zenoh
would otherwise carry big payloads through /dev/shm across namespaces, docs/design/zenoh.md §10). Needs
root and ``ip``/``tc``; skipped otherwise. Each test creates and deletes its own namespace.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

import anyio
import numpy as np
import pytest

from servo.client import PolicyClient, SendFailed, SessionLost
from servo.transport import ZenohSettings
from testbed.netns import Link, available, shaped_link
from tests.server.test_cli import Lines
from tests.support import camera_frames, free_port

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.skipif(
        not available(),
        reason="needs root, ip and tc (network namespace + veth + tbf)",
    ),
]

REPO = Path(__file__).resolve().parents[2]
RATE_MBIT = 100
HEIGHT, WIDTH = 480, 640
#: Bytes of one raw observation's frames (two cameras), and the link time they need.
RAW_BYTES = 2 * HEIGHT * WIDTH * 3
MIN_TRANSFER_S = RAW_BYTES * 8 / (RATE_MBIT * 1e6)


@pytest.fixture
def link() -> Iterator[Link]:
    with shaped_link(RATE_MBIT) as made:
        yield made


@asynccontextmanager
async def server_in(link: Link, tmp_path: Path) -> AsyncIterator[int]:
    """``servo-serve`` (reference policy, two 480x640 cameras) in the namespace; yields its port."""
    port = free_port()
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(
        f"""
[model]
source = "reference"
warmup = 1
[model.options]
cameras = {{front = [{HEIGHT}, {WIDTH}], wrist = [{HEIGHT}, {WIDTH}]}}
[serving]
app = "link"
[zenoh]
listen = ["tcp/{link.server_ip}:{port}"]
shared_memory = false
[ops]
health_port = 0
[security]
insecure = true  # plain TCP on the test's private veth link, said explicitly
allow_any_robot = true  # the test's robots are not enrolled: this test is about the link
"""
    )
    # As on another host: its own /dev/shm and host name (a server on this host is a local link to the codec).
    command = link.remote(sys.executable, "-m", "servo.cli.serve", str(manifest))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = await anyio.open_process(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO, env=env)
    try:
        await Lines(process).until(lambda line: "servo-serve: ready" in line, timeout=60)
        yield port
    finally:
        if process.returncode is None:
            process.kill()
        with anyio.move_on_after(10, shield=True):
            await process.wait()
        await process.aclose()


def _frames() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)  # noise: no codec could shrink it, every byte crosses the link
    return {name: rng.integers(0, 255, (HEIGHT, WIDTH, 3), dtype=np.uint8) for name in ("front", "wrist")}


@asynccontextmanager
async def client_of(link: Link, port: int, *, jpeg_quality: int | Literal["auto"] = 0) -> AsyncIterator[PolicyClient]:
    settings = ZenohSettings(mode="client", connect=[f"tcp/{link.server_ip}:{port}"], shared_memory=False)
    async with PolicyClient.connect(settings, "slow-link", jpeg_quality=jpeg_quality) as client:
        yield client


async def test_raw_observations_cross_a_100_mbit_link(link: Link, tmp_path: Path) -> None:
    async with server_in(link, tmp_path) as port, client_of(link, port) as client:
        (server,) = await client.discover(app="link")
        session = await client.open_session(server, features=server.status.policy.features, fps=30.0)
        state, frames = np.zeros(6, np.float32), _frames()
        for _ in range(3):
            result = await session.infer(state, frames, timeout=5.0)
            assert result.chunk_robot.shape[1] == 6
            # The frames really crossed the shaped link (no shared-memory shortcut).
            assert result.rtt_ns / 1e9 >= MIN_TRANSFER_S
        assert session.stats.send_failed == 0
        await session.close()


async def test_a_dead_link_fails_the_request_long_before_its_timeout(link: Link, tmp_path: Path) -> None:
    async with server_in(link, tmp_path) as port, client_of(link, port) as client:
        (server,) = await client.discover(app="link")
        session = await client.open_session(server, features=server.status.policy.features, fps=30.0)
        state, frames = np.zeros(6, np.float32), _frames()
        await session.infer(state, frames, timeout=5.0)
        # Mid-transfer: the put blocks, then the lease ends.
        await anyio.run_process(["ip", "link", "set", link.host_veth, "down"])
        seq = await session.send(state, frames)
        with anyio.fail_after(4.0):  # the lease (1 s) and a little: not the 30 s request timeout
            with pytest.raises((SendFailed, SessionLost)):
                await session.receive(seq, timeout=30.0)
        await session.close()


async def test_auto_picks_jpeg_on_a_100_mbit_link(link: Link, tmp_path: Path) -> None:
    # The loopback / shared-memory half (auto picks raw) is tests/client/test_codec.py.
    async with server_in(link, tmp_path) as port, client_of(link, port, jpeg_quality="auto") as client:
        (server,) = await client.discover(app="link")
        session = await client.open_session(server, features=server.status.policy.features, fps=30.0)
        state, frames = np.zeros(6, np.float32), camera_frames(HEIGHT, WIDTH)
        for _ in range(30):  # startup measures raw and each quality three times, then decides
            await session.infer(state, frames, timeout=5.0)
        status = session.codec.status()
        assert status.current.startswith("jpeg"), status
        assert status.cost_ms["raw"] > 2 * status.cost_ms[status.current], status
        assert status.link_mbps is not None
        assert status.link_mbps < RATE_MBIT, status  # raw crossed the shaped link
        await session.close()
