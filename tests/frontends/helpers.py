"""What the openpi front door's tests share: a server with its front door, openpi's client on a thread."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import numpy as np
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosed

from servo.frontends import frontends_of
from servo.server.manifest import Manifest
from servo.server.service import PolicyServer, ServerReady
from tests.server.helpers import server_manifest
from tests.server.policies import CHUNK, FixedComputePolicy
from tests.support import free_port

T = TypeVar("T")


@asynccontextmanager
async def front_door(
    policy: FixedComputePolicy, *, openpi: str = "", serving: str = "", extra: str = ""
) -> AsyncIterator[tuple[PolicyServer, ServerReady, int]]:
    """A server with its openpi front door; yields the server, its ready info and the port."""
    manifest = server_manifest(
        free_port(), serving=serving, extra=f'{extra}\n[frontends.openpi]\nlisten = "127.0.0.1:0"\n{openpi}'
    )
    async with serving_door(manifest, policy) as served:
        yield served


@asynccontextmanager
async def serving_door(
    manifest: Manifest, policy: FixedComputePolicy
) -> AsyncIterator[tuple[PolicyServer, ServerReady, int]]:
    """The server of ``manifest`` with the front door it configures; yields the server, its ready info and the port."""
    server = PolicyServer(manifest, policy=policy, frontends=frontends_of(manifest))
    async with anyio.create_task_group() as tg:
        ready: ServerReady = await tg.start(server.run)
        try:
            yield server, ready, int(ready.frontends["openpi"].rsplit(":", 1)[1])
        finally:
            server.drain()


async def blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run openpi's synchronous client code on a worker thread, with a deadline."""
    with anyio.fail_after(20):
        return await anyio.to_thread.run_sync(fn, *args)


def aloha_obs(state: float, *, size: tuple[int, int] = (24, 32)) -> dict[str, Any]:
    """An ALOHA-style observation: float64 state, channels-first frames, a prompt."""
    h, w = size
    return {"state": np.full(6, state), "images": {"front": np.zeros((3, h, w), np.uint8)}, "prompt": "fold"}


def expected_chunk(state: np.ndarray) -> np.ndarray:
    steps = np.arange(CHUNK, dtype=np.float32)[:, None] * np.float32(0.01)
    return np.asarray(state, np.float32)[None, :] + steps


def served_until_closed(client: WebsocketClientPolicy, within_s: float, why: str) -> ConnectionClosed:
    """Blocking: ``client`` asks again and again until the door closes its connection (how); fails after ``within_s``.

    A request that raced the close may still be answered, so one refusal is never counted on.
    """
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            client.infer(aloha_obs(1.0))
        except ConnectionClosed as closed:
            return closed
    raise AssertionError(f"the front door still answers {within_s:g} s after {why}")
