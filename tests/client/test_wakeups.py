"""The caller's event loop wakes once per round trip: for the answer, not for the put that left."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from tests.server.helpers import connected, observation, open_on
from tests.server.policies import FixedComputePolicy
from tests.support import make_manifest, running_server

pytestmark = pytest.mark.anyio


async def test_a_round_trip_wakes_the_loop_only_for_its_answer(port: int) -> None:
    manifest = make_manifest(port, options="cameras = {front = [24, 32]}")
    async with running_server(manifest, FixedComputePolicy()) as (_, ready), connected(port, "robot") as client:
        session = await open_on(client, ready)
        await session.infer(*observation(0.0), timeout=5)  # settles the entities' own first calls
        calls: Counter[str] = Counter()
        bridge_call = session._bridge.call

        def counted(fn: Any, *args: Any) -> None:
            calls[getattr(fn, "__name__", repr(fn))] += 1
            bridge_call(fn, *args)

        session._bridge.call = counted  # type: ignore[method-assign]
        for step in range(1, 6):
            state, frames = observation(float(step))
            chunk = await session.infer(state, frames, timeout=5)
            np.testing.assert_allclose(chunk.chunk_robot[0], state)
        seen = Counter(calls)  # before the close, whose undeclarations call back on their own
        await session.close()
    assert seen == Counter({"_on_message": 5}), seen
