"""Round-robin scheduling: many clients, one worker, nobody starves; a new session asks first."""

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

from servo.client import PolicyClient, RemoteSession
from tests.server.helpers import connected, metric, observation, open_on, server_manifest
from tests.server.policies import FixedComputePolicy
from tests.support import eventually, make_manifest, running_server

pytestmark = pytest.mark.anyio

N_CLIENTS = 8
ROUNDS = 12
#: New sessions opened one after another on each newcomer lane (each asks once and closes).
NEWCOMERS_PER_LANE = 8
#: States from this value up are the newcomers'.
NEWCOMER = 100


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
        # Until something was superseded too: on a starved machine the server may take each of
        # a burst before the next arrives, and then nothing waits to be superseded.
        while greedy_served < 15 or not greedy_superseded:
            for _ in range(4):  # four observations in a row: while one is served, the rest wait
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


async def test_a_new_sessions_first_request_goes_ahead_of_the_established_ones(port: int) -> None:
    """A robot whose session just opened (a failover, a restart) has no chunk of this replica
    yet, while the established robots still run on theirs: its first request is served before
    the established requests waiting, even those the worker already holds, and new sessions keep
    their arrival order among themselves. Its next request queues like anybody's."""
    policy = SteppedPolicy()
    manifest = make_manifest(port, extra="[serving]\nmax_sessions = 6\n")

    async def next_forward() -> int:
        return await anyio.to_thread.run_sync(lambda: policy.started.get(timeout=10))

    async def queued(*names: str) -> None:
        def waiting() -> bool:
            sessions = [server.registry.by_client(name) for name in names]
            return all(s is not None and (s.mailbox is not None or s.held) for s in sessions)

        await eventually(waiting, what=f"{names} queued")

    async with running_server(manifest, policy=policy) as (server, ready), connected(port, "old-0") as first:
        clients = [first, *(PolicyClient(first.zsession, f"old-{i}") for i in (1, 2, 3))]
        old = [await open_on(client, ready) for client in clients]
        for index, session in enumerate(old):
            await session.infer(*observation(index), timeout=5)  # served once: established
        policy.armed = True
        with anyio.fail_after(30):
            await old[0].send(*observation(0))
            assert await next_forward() == 0  # old-0 holds the device
            for index in (1, 2, 3):
                await old[index].send(*observation(index))
            await queued("old-1", "old-2", "old-3")
            policy.step.release()
            assert await next_forward() == 1  # the worker took old-2 and old-3 into its queue
            new = [await open_on(PolicyClient(first.zsession, name), ready) for name in ("new-1", "new-2")]
            seqs = {11: await new[0].send(*observation(11)), 12: await new[1].send(*observation(12))}
            await old[0].send(*observation(10))
            await queued("new-1", "new-2", "old-0")
            order = []
            for _ in range(5):
                policy.step.release()
                order.append(await next_forward())
            policy.armed = False
            policy.step.release()
            assert order == [11, 12, 2, 3, 10]
            for session, value in zip(new, (11, 12), strict=True):
                assert (await session.receive(seqs[value], timeout=5)).chunk_robot[0][0] == value
            assert (await new[0].infer(*observation(21), timeout=5)).chunk_robot[0][0] == 21
        for session in (*old, *new):
            await session.close()


async def test_established_sessions_keep_their_share_while_new_sessions_keep_arriving(port: int) -> None:
    """Four robots stream while new sessions open one after another on two lanes, each asking
    once and closing: every newcomer gets its own chunk, and the established robots are served
    evenly all along, newcomers or not (each newcomer has one first request; `ServiceOrder`
    bounds how often they overtake, see test_scheduler.py)."""
    policy = FixedComputePolicy(compute_ms=4)
    manifest = make_manifest(port, extra="[serving]\nmax_sessions = 8\n")
    received: Counter[int] = Counter()
    newcomers_served = 0
    stop = anyio.Event()

    async def robot(session: RemoteSession, index: int) -> None:
        while not stop.is_set():
            result = await session.infer(*observation(index), timeout=5)
            assert result.chunk_robot[0][0] == index
            received[index] += 1

    async def newcomers(client: PolicyClient, lane: int) -> None:
        nonlocal newcomers_served
        for k in range(NEWCOMERS_PER_LANE):
            value = NEWCOMER + 10 * lane + k
            session = await open_on(PolicyClient(client.zsession, f"new-{value}"), ready)
            assert (await session.infer(*observation(value), timeout=5)).chunk_robot[0][0] == value
            await session.close()
            newcomers_served += 1

    async with running_server(manifest, policy=policy) as (server, ready), connected(port, "old") as first:
        old = [await open_on(PolicyClient(first.zsession, f"old-{i}"), ready) for i in range(4)]
        policy.served.clear()
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for index, session in enumerate(old):
                    tg.start_soon(robot, session, index)
                async with anyio.create_task_group() as lanes:
                    for lane in (0, 1):
                        lanes.start_soon(newcomers, first, lane)
                stop.set()
        for session in old:
            await session.close()
    assert newcomers_served == 2 * NEWCOMERS_PER_LANE
    order = policy.served
    arrivals = [position for position, value in enumerate(order) if value >= NEWCOMER]
    while_new = Counter(order[arrivals[0] : arrivals[-1]])
    assert all(while_new[index] > 0 for index in range(4)), while_new  # nobody waited for the newcomers to end
    counts = [received[i] for i in range(4)]
    assert max(counts) - min(counts) <= 2, counts
    assert metric(server, "servo_requests_total", outcome="ok") == len(order)


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
