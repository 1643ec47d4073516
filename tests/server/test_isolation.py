"""Per-session processors: two robots never see each other's state."""

from __future__ import annotations

import anyio
import numpy as np
import pytest

from servo.client import RemoteSession
from tests.server.helpers import cameras_of, connected, observation, open_on
from tests.server.policies import StickyPolicy
from tests.support import make_manifest, running_server

pytestmark = pytest.mark.anyio

REQUESTS = 12


async def test_reference_relative_processor_anchors_each_chunk_on_its_own_state(port: int) -> None:
    """The reference policy's RelativeProcessor caches the state at preprocess and adds it back at
    postprocess; two clients with very different states, requests interleaved and overlapping."""
    manifest = make_manifest(port, options="cameras = {front = [48, 64]}\ncompute_ms = 3.0")
    states = {"low": np.linspace(-90, -80, 6, dtype=np.float32), "high": np.linspace(80, 90, 6, dtype=np.float32)}
    seen: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {"low": [], "high": []}

    async def robot(session: RemoteSession, name: str, cams: dict[str, tuple[int, int]]) -> None:
        rng = np.random.default_rng(len(name))
        for _ in range(REQUESTS):
            state = states[name] + rng.uniform(-1, 1, 6).astype(np.float32)
            result = await session.infer(*observation(state, cams), timeout=5)
            seen[name].append((state, result.chunk_robot - result.chunk_model))

    async with running_server(manifest) as (_, ready):
        cams = cameras_of(ready)
        async with connected(port, "low") as c_low, connected(port, "high") as c_high:
            low, high = await open_on(c_low, ready), await open_on(c_high, ready)
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(robot, low, "low", cams)
                    tg.start_soon(robot, high, "high", cams)
            await low.close()
            await high.close()
    for name in ("low", "high"):
        assert len(seen[name]) == REQUESTS
        for state, offset in seen[name]:
            # robot = model + the state cached at preprocess: this request's own state, every step
            np.testing.assert_allclose(offset, np.broadcast_to(state, offset.shape), atol=1e-3)


@pytest.mark.parametrize("process", ["inline", "separate"])
async def test_processor_state_held_across_requests_stays_per_session(port: int, process: str) -> None:
    """A processor that keeps an anchor and a count across requests: each session's chunks show
    only its own history, also after one of them resets its episode (in the policy process too)."""
    policy = StickyPolicy(compute_ms=2) if process == "inline" else None
    manifest = make_manifest(port, source="tests.server.policies:make_sticky", options="compute_ms = 2")
    anchors = {"a": 100.0, "b": -500.0}
    results: dict[str, list[np.ndarray]] = {"a": [], "b": []}

    async def robot(session: RemoteSession, name: str) -> None:
        for i in range(REQUESTS):
            if name == "b" and i == REQUESTS // 2:
                await session.reset(1)
            # only the first state of an episode becomes the anchor; later ones must not leak
            state = anchors[name] if i in (0, REQUESTS // 2) else anchors[name] + 7.0 * (i + 1)
            result = await session.infer(*observation(state), timeout=5)
            results[name].append(result.chunk_robot)

    async with (
        running_server(manifest, policy=policy) as (_, ready),
        connected(port, "a") as ca,
        connected(port, "b") as cb,
    ):
        sa, sb = await open_on(ca, ready), await open_on(cb, ready)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(robot, sa, "a")
                tg.start_soon(robot, sb, "b")
        await sa.close()
        await sb.close()
    for i, chunk in enumerate(results["a"]):
        np.testing.assert_array_equal(chunk, np.full_like(chunk, anchors["a"] + i + 1))
    half = REQUESTS // 2
    for i, chunk in enumerate(results["b"]):
        count = i + 1 if i < half else i - half + 1  # the reset restarted b's processor
        np.testing.assert_array_equal(chunk, np.full_like(chunk, anchors["b"] + count))
