"""Helpers shared by the benchmarks (benches never import tests)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from servo.policy import Policy
from servo.server.manifest import parse_manifest
from servo.server.service import PolicyServer, ServerReady


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (chosen by the kernel)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def in_process_server(port: int, policy: Policy) -> AsyncIterator[ServerReady]:
    """Serve ``policy`` on 127.0.0.1:``port`` from this process until the block exits, then drain."""
    manifest = parse_manifest(
        f"""
[model]
source = "injected"
warmup = 1
[zenoh]
listen = ["tcp/127.0.0.1:{port}"]
"""
    )
    server = PolicyServer(manifest, policy=policy)
    async with anyio.create_task_group() as tg:
        ready: ServerReady = await tg.start(server.run)
        try:
            yield ready
        finally:
            server.drain()
