"""Round-robin scheduling: many clients, one worker, nobody starves."""

from __future__ import annotations

import contextlib
import json
import queue
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from anyio.abc import TaskStatus

from servo.client import RemoteSession
from tests.server.helpers import connected, metric, observation, open_on, server_manifest
from tests.server.policies import FixedComputePolicy
from tests.support import eventually, make_manifest, running_server

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


class SteppedPolicy(FixedComputePolicy):
    """Once armed, each forward reports its state on ``started`` and waits for one ``step``."""

    def __init__(self) -> None:
        super().__init__()
        self.started: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.step = threading.Semaphore(0)
        self.armed = False

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: Any) -> np.ndarray:
        if self.armed:
            self.started.put(int(batch["state"][0]))
            if not self.step.acquire(timeout=10):
                raise TimeoutError("the test never let this forward finish")
        return super().predict_chunk(batch, inference_delay, prefix)


async def test_a_newer_observation_takes_the_turn_of_the_one_it_supersedes(port: int) -> None:
    """Newest wins without losing its place: an observation that supersedes one already queued
    for the device is served in that one's turn, not after everybody who queued meanwhile."""
    policy = SteppedPolicy()
    manifest = make_manifest(port, extra="[serving]\nmax_sessions = 4\n")

    async def next_forward() -> int:
        return await anyio.to_thread.run_sync(lambda: policy.started.get(timeout=10))

    async with running_server(manifest, policy=policy) as (server, ready), contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(connected(port, name)) for name in "xbrc"]
        x, b, r, c = [await open_on(client, ready) for client in clients]
        held = {name: s for name in "xbrc" if (s := server.registry.by_client(name)) is not None}
        policy.armed = True
        with anyio.fail_after(30):
            await x.send(*observation(0))
            assert await next_forward() == 0  # x holds the device
            await b.send(*observation(1))
            await r.send(*observation(2))
            await eventually(lambda: all(held[n].mailbox is not None for n in "br"), what="b and r queued")
            policy.step.release()
            assert await next_forward() == 1  # b, then r: the worker holds r's observation
            await eventually(lambda: held["r"].held, what="r's observation held")
            newer = await r.send(*observation(20))  # supersedes the held one
            await c.send(*observation(3))
            await eventually(lambda: all(held[n].mailbox is not None for n in "rc"), what="r2 and c queued")
            policy.step.release()
            assert await next_forward() == 20  # r's newer observation, in r's turn
            policy.step.release()
            assert await next_forward() == 3
            policy.step.release()
            result = await r.receive(newer, timeout=10)
        assert result.chunk_robot[0][0] == 20
        assert result.superseded == 1
        for session in (x, b, r, c):
            await session.close()


async def test_replies_leave_in_the_order_the_forwards_served_them(port: int, tmp_path: Path) -> None:
    """One reply stage, one FIFO: the audit line, written right after each reply's put, follows
    the service order, while the worker already runs the next forward as a reply leaves."""
    audit = tmp_path / "audit.jsonl"
    policy = FixedComputePolicy(compute_ms=2)
    manifest = server_manifest(port, serving="max_sessions = 6", ops=f'health_port = 0\naudit_log = "{audit}"')
    rounds = 10

    async def robot(session: RemoteSession, index: int) -> None:
        for _ in range(rounds):
            await session.infer(*observation(index), timeout=5)

    async with running_server(manifest, policy=policy) as (_, ready), contextlib.AsyncExitStack() as stack:
        policy.served.clear()
        clients = [await stack.enter_async_context(connected(port, f"robot-{i}")) for i in range(6)]
        sessions = [await open_on(client, ready) for client in clients]
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for index, session in enumerate(sessions):
                    tg.start_soon(robot, session, index)
        for session in sessions:
            await session.close()
    by_session = {session.session_id: index for index, session in enumerate(sessions)}
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    published = [by_session[line["session_id"]] for line in lines if line["session_id"] in by_session]
    assert len(published) == 6 * rounds
    assert published == policy.served
