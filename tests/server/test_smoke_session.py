import time

import numpy as np
import pytest

from servo.client import PolicyClient
from tests.support import client_settings, make_manifest, running_server

pytestmark = pytest.mark.anyio


async def test_one_round_trip(port: int) -> None:
    async with (
        running_server(make_manifest(port)) as (_, ready),
        PolicyClient.connect(client_settings(port), "arm-1") as client,
    ):
        (server,) = await client.discover()
        session = await client.open_session(server, features=ready.info.features, fps=30)
        taken = time.monotonic_ns()
        result = await session.infer(np.zeros(6, np.float32), {"front": np.zeros((48, 64, 3), np.uint8)}, mono_ns=taken)
        assert result.chunk_robot.shape == (50, 6)
        assert result.obs_mono_ns == taken
        assert 0 < result.rtt_ns <= time.monotonic_ns() - taken
        await session.close()


async def test_a_session_for_a_block_is_closed_when_it_ends(port: int) -> None:
    async with (
        running_server(make_manifest(port)) as (server, ready),
        PolicyClient.connect(client_settings(port), "arm-2") as client,
    ):
        async with client.session(features=ready.info.features, fps=30) as session:
            result = await session.infer(np.zeros(6, np.float32), {"front": np.zeros((48, 64, 3), np.uint8)})
            assert result.chunk_robot.shape == (50, 6)
            (opened,) = server.registry.snapshot()
            assert opened.session_id == session.session_id
        assert session.lost.is_set()
        await server.wait_sessions(lambda sessions: not sessions)  # closed at once, not collected later
