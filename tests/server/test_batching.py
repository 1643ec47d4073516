"""Micro-batching through a running server: who is grouped, what the policy sees, who fails.

(Frames of another size than the policy's never reach a mailbox — `servo.server.admission`
refuses them — so the shape rule is tested on the scheduler alone, in test_scheduler.py.)

Each test holds the device with one session's forward (`GatedBatchingPolicy`), lets the other
sessions' observations queue up, then opens the gate: the queued ones are the next group.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import numpy as np
import pytest

from servo.client import RemoteSession, ServerError
from servo.server.service import PolicyServer
from tests.server.helpers import connected, metric, observation, open_on
from tests.server.policies import CHUNK, GatedBatchingPolicy
from tests.support import eventually, make_manifest, running_server

pytestmark = pytest.mark.anyio

HOLDER = 100.0


def request(value: float, **extra: Any) -> dict[str, Any]:
    """Keyword arguments of `RemoteSession.send` for a state filled with ``value``."""
    state, images = observation(value)
    return {"state": state, "images": images, **extra}


@asynccontextmanager
async def fleet(
    port: int, policy: GatedBatchingPolicy, n: int, *, serving: str = "", **options: Any
) -> AsyncIterator[tuple[PolicyServer, RemoteSession, list[RemoteSession]]]:
    """A server, the session that holds the device and ``n`` others, all open."""
    manifest = make_manifest(port, extra=f"[serving]\nmax_sessions = {n + 1}\n{serving}")
    async with AsyncExitStack() as stack:
        server, ready = await stack.enter_async_context(running_server(manifest, policy=policy))
        policy.served.clear()  # forget the warm-up forwards (one per batch size the server can form)
        policy.batches.clear()
        sessions = []
        for i in range(n + 1):
            client = await stack.enter_async_context(connected(port, f"robot-{i}"))
            sessions.append(await open_on(client, ready, **options))
        yield server, sessions[0], sessions[1:]
        for session in sessions:
            await session.close()


async def queue_behind_the_holder(
    server: PolicyServer,
    policy: GatedBatchingPolicy,
    holder: RemoteSession,
    sends: list[tuple[RemoteSession, dict[str, Any]]],
) -> tuple[int, list[int]]:
    """Hold the device, send ``sends`` while it is held, release it; returns the seq ids."""
    policy.armed = True
    held = await holder.send(*observation(HOLDER))
    assert await anyio.to_thread.run_sync(policy.entered.wait, 5)
    seqs = [await session.send(**kwargs) for session, kwargs in sends]
    await eventually(lambda: all(server.registry.get(s.session_id).mailbox is not None for s, _ in sends))  # type: ignore[union-attr]
    policy.gate.set()
    return held, seqs


async def test_queued_sessions_are_served_in_one_forward_each_on_its_own_state(port: int) -> None:
    policy = GatedBatchingPolicy()
    async with fleet(port, policy, 4) as (server, holder, others):
        sends = [(s, request(i + 1)) for i, s in enumerate(others)]
        held, seqs = await queue_behind_the_holder(server, policy, holder, sends)
        assert (await holder.receive(held, timeout=5)).chunk_robot[0][0] == HOLDER
        for i, (session, seq) in enumerate(zip(others, seqs, strict=True)):
            result = await session.receive(seq, timeout=5)
            np.testing.assert_array_equal(result.chunk_robot[0], np.full(6, i + 1, np.float32))  # its own state
            assert result.chunk_robot.shape == (CHUNK, 6)
    ((batch_states, _, _),) = policy.batches
    assert sorted(batch_states) == [1, 2, 3, 4]
    assert metric(server, "servo_batch_size_count") == 2  # the holder alone, then the four together
    assert metric(server, "servo_batch_size_sum") == 5
    assert metric(server, "servo_requests_total", outcome="ok") == 5


async def test_per_sample_delay_and_prefix_reach_the_policy(port: int) -> None:
    # At 1 fps a delay of d steps is a deadline d seconds away: none of them limits the group.
    policy = GatedBatchingPolicy(supports_rtc=True, fps=1.0)
    async with fleet(port, policy, 3, rtc=True) as (server, holder, others):
        sends = [
            (s, request(i + 1, inference_delay_steps=i, prefix_model=np.zeros((i + 2, 6), np.float32)))
            for i, s in enumerate(others)
        ]
        _held, seqs = await queue_behind_the_holder(server, policy, holder, sends)
        for session, seq in zip(others, seqs, strict=True):
            await session.receive(seq, timeout=5)
    ((batch_states, delays, prefixes),) = policy.batches
    per_state = {s: (d, p) for s, d, p in zip(batch_states, delays, prefixes, strict=True)}
    assert per_state == {1: (0, 2), 2: (1, 3), 3: (2, 4)}


async def test_one_members_bad_input_does_not_fail_the_others(port: int) -> None:
    policy = GatedBatchingPolicy()
    async with fleet(port, policy, 4) as (server, holder, others):
        values = [1.0, -1.0, 3.0, 4.0]  # the policy raises on a negative state
        sends = [(s, request(v)) for s, v in zip(others, values, strict=True)]
        sends[3] = (others[3], request(float("nan")))  # refused before the policy sees it
        _held, seqs = await queue_behind_the_holder(server, policy, holder, sends)
        for session, seq, value in zip(others[:3], seqs[:3], values[:3], strict=True):
            if value < 0:
                with pytest.raises(ServerError) as info:
                    await session.receive(seq, timeout=5)
                assert info.value.code == "inference_failed"
            else:
                assert (await session.receive(seq, timeout=5)).chunk_robot[0][0] == value
        with pytest.raises(ServerError) as info:
            await others[3].receive(seqs[3], timeout=5)
        assert info.value.code == "bad_observation"
    assert [sorted(states) for states, _, _ in policy.batches] == [[-1, 1, 3]]  # tried together, then alone
    assert sorted(policy.served) == [1, 3, HOLDER]
    assert metric(server, "servo_requests_total", outcome="inference_failed") == 1


async def test_max_batch_one_keeps_round_robin(port: int) -> None:
    policy = GatedBatchingPolicy()
    async with fleet(port, policy, 3, serving="max_batch = 1\n") as (server, holder, others):
        sends = [(s, request(i + 1)) for i, s in enumerate(others)]
        _held, seqs = await queue_behind_the_holder(server, policy, holder, sends)
        for session, seq in zip(others, seqs, strict=True):
            await session.receive(seq, timeout=5)
    assert policy.batches == []
    assert policy.served == [HOLDER, 1, 2, 3]  # one at a time, in ring order


async def test_a_new_sessions_first_request_leads_the_next_batch(port: int) -> None:
    """A session's first request goes ahead of the established sessions' (`ServiceOrder`) and
    still shares its forward: with batches of two, the newcomer that queued last is in the first."""
    policy = GatedBatchingPolicy()
    async with fleet(port, policy, 4, serving="max_batch = 2\n") as (server, holder, others):
        *established, newcomer = others
        for i, session in enumerate(established):
            await session.infer(*observation(i + 1), timeout=5)  # served once (the gate is not armed yet)
        policy.batches.clear()
        sends = [(s, request(i + 1)) for i, s in enumerate(established)] + [(newcomer, request(9))]
        _held, seqs = await queue_behind_the_holder(server, policy, holder, sends)
        for (session, kwargs), seq in zip(sends, seqs, strict=True):
            assert (await session.receive(seq, timeout=5)).chunk_robot[0][0] == kwargs["state"][0]
    assert [states for states, _, _ in policy.batches] == [[9, 1], [2, 3]]
