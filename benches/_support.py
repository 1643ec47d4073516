"""Helpers shared by the benchmarks (benches never import tests)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from servo.policy import Policy
from servo.server.manifest import parse_manifest
from servo.server.service import PolicyServer, ServerReady

RESULTS = Path(__file__).resolve().parent / "results"


def publish(request: pytest.FixtureRequest, text: str, name: str, *, smoke: bool) -> None:
    """Print a results table past pytest's capture; a real (not smoke) run also writes it to results/."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print("\n" + text, flush=True)
    if not smoke:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / name).write_text(text + "\n")


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
