"""Round-robin scheduling: many clients, one worker, nobody starves."""

from __future__ import annotations

from collections import Counter

import anyio
import numpy as np
import pytest
from anyio.abc import TaskStatus

from servo.client import RemoteSession
from tests.server.helpers import connected, metric, observation, open_on
from tests.server.policies import FixedComputePolicy
from tests.support import make_manifest, running_server

pytestmark = pytest.mark.anyio

N_CLIENTS = 8
ROUNDS = 12


async def test_eight_concurrent_clients_are_served_round_robin(port: int) -> None:
    policy = FixedComputePolicy(compute_ms=8)
    manifest = make_manifest(port, extra="[serving]\nmax_sessions = 8\n")
    received: Counter[int] = Counter()
    stop = anyio.Event()
    go = anyio.Event()
    opened = 0

    async def robot(index: int, *, task_status: TaskStatus[None]) -> None:
        nonlocal opened
        async with connected(port, f"robot-{index}") as client:
            session = await open_on(client, ready)
            task_status.started()
            await go.wait()
            while not stop.is_set():
                result = await session.infer(*observation(index), timeout=5)
                np.testing.assert_array_equal(result.chunk_robot[0], np.full(6, index, np.float32))
                received[index] += 1
                if sum(received.values()) >= N_CLIENTS * ROUNDS:
                    stop.set()
            await session.close()

    async with running_server(manifest, policy=policy) as (server, ready):
        policy.served.clear()  # forget the warm-up forwards
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for i in range(N_CLIENTS):
                    await tg.start(robot, i)
                assert len(server.registry) == N_CLIENTS
                go.set()
    counts = [received[i] for i in range(N_CLIENTS)]
    assert min(counts) >= ROUNDS - 2, counts
    assert max(counts) - min(counts) <= 2, counts
    assert max(counts) / min(counts) <= 1.2, counts
    # Server side: in service order, no client is served twice while another waits a whole
    # cycle — between two services of one client there are at most 2 cycles of the others.
    order = policy.served
    assert Counter(order).keys() == set(range(N_CLIENTS))
    last: dict[int, int] = {}
    for position, client in enumerate(order):
        if client in last:
            assert position - last[client] <= 2 * N_CLIENTS, (client, order)
        last[client] = position
    assert metric(server, "servo_requests_total", outcome="ok") == len(order)


async def test_greedy_client_cannot_starve_the_others(port: int) -> None:
    """A client that floods observations gets one inference per cycle like everybody else; what
    it floods is superseded (newest wins) and the count comes back in its next chunk."""
    policy = FixedComputePolicy(compute_ms=10)
    manifest = make_manifest(port, extra="[serving]\nmax_sessions = 4\n")
    polite_served: Counter[int] = Counter()
    greedy_superseded = 0
    greedy_served = 0
    stop = anyio.Event()

    async def polite(session: RemoteSession, index: int) -> None:
        while not stop.is_set():
            await session.infer(*observation(index), timeout=5)
            polite_served[index] += 1

    async def greedy(session: RemoteSession) -> None:
        nonlocal greedy_superseded, greedy_served
        while greedy_served < 15:
            for _ in range(4):  # four observations in a row: three of them are superseded
                seq = await session.send(*observation(9))
            result = await session.receive(seq, timeout=5)
            greedy_superseded += result.superseded
            greedy_served += 1
        stop.set()

    async with running_server(manifest, policy=policy) as (server, ready):
        policy.served.clear()
        async with (
            connected(port, "polite-0") as c0,
            connected(port, "polite-1") as c1,
            connected(port, "greedy") as cg,
        ):
            sessions = [await open_on(c, ready) for c in (c0, c1, cg)]
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(polite, sessions[0], 0)
                    tg.start_soon(polite, sessions[1], 1)
                    tg.start_soon(greedy, sessions[2])
            for session in sessions:
                await session.close()
    served = Counter(policy.served)
    assert greedy_superseded > 0
    # The greedy client got no more than its share: each polite client was served at least
    # about as often while it waited for its chunks.
    for index in (0, 1):
        assert served[index] >= served[9] - 2, served
    assert metric(server, "servo_superseded_observations_total") >= greedy_superseded
