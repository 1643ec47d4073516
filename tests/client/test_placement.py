"""Placement: a validated score, and a burst of simultaneous connects spread over the replicas.

Three in-process replicas join a router opened by the test; robots share one client session.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import msgspec
import pytest

from servo.client import PolicyClient, RemoteSession
from servo.client.discovery import ServerInfo, first_choice, placement_score
from servo.transport import ZenohSettings, open_zsession
from servo.wire import ServerKeys, StatusReply
from tests.client.test_verify import status
from tests.support import client_settings, free_port, make_manifest, running_server

pytestmark = pytest.mark.anyio


def test_the_score_counts_sessions_and_recent_queue_wait_not_the_advertised_load() -> None:
    idle = msgspec.structs.replace(status(bytes(32)), active_sessions=0, max_sessions=8, load=0.0)
    busy = msgspec.structs.replace(idle, active_sessions=4)
    lying = msgspec.structs.replace(busy, load=0.0)  # four sessions, advertised as idle
    waiting = msgspec.structs.replace(idle, queue_wait_ms=750.0)
    assert placement_score(idle) == 0.0
    assert placement_score(busy) == placement_score(lying) == 0.5
    assert placement_score(waiting) == 0.75


def test_an_impossible_queue_wait_does_not_decode() -> None:
    reply = msgspec.structs.asdict(status(bytes(32)))
    for bad in (-1.0, float("nan")):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert({**reply, "queue_wait_ms": bad}, StatusReply)


@asynccontextmanager
async def three_replicas() -> AsyncIterator[int]:
    """A router and three replicas of the reference policy joined to it; yields the router port."""
    router_port = free_port()
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(
            open_zsession(ZenohSettings(mode="router", listen=[f"tcp/127.0.0.1:{router_port}"]))
        )
        for name in ("r0", "r1", "r2"):
            manifest = make_manifest(
                free_port(),
                zenoh=f'mode = "peer"\nconnect = ["tcp/127.0.0.1:{router_port}"]',
                extra=f'[serving]\napp = "spread"\nreplica = "{name}"\nmax_sessions = 16\n'
                "[security]\nlisten_beside_router = true",  # peers beside the router, on purpose
            )
            await stack.enter_async_context(running_server(manifest))
        yield router_port


async def test_thirty_simultaneous_connects_split_evenly_over_three_replicas() -> None:
    async with three_replicas() as router_port, open_zsession(client_settings(router_port)) as zsession:
        probe = PolicyClient(zsession, "probe")
        with anyio.fail_after(10):
            while len(await probe.discover(app="spread")) < 3:  # noqa: ASYNC110 - joins have no event
                await anyio.sleep(0.05)
        (server, *_) = await probe.discover(app="spread")
        policy = server.status.policy
        sessions: list[RemoteSession] = []

        async def robot(i: int) -> None:
            client = PolicyClient(zsession, f"robot-{i}")
            # Thirty handshakes at once on a loaded machine wait for cores: placement is checked here, not latency.
            opened = await client.connect_best(features=policy.features, fps=policy.fps, app="spread", timeout=20.0)
            sessions.append(opened)

        try:
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    for i in range(30):
                        tg.start_soon(robot, i)
            mine = Counter(session.server.keys.replica for session in sessions)
            seen = {s.keys.replica: s.status.active_sessions for s in await probe.discover(app="spread")}
        finally:
            for session in sessions:
                await session.close()
    assert len(sessions) == 30
    assert seen == dict(mine)  # the servers count what the robots hold: nobody left a session behind
    assert max(mine.values()) / min(mine.values()) <= 1.1, mine


def info(replica: str, active: int, *, max_sessions: int = 100, draining: bool = False) -> ServerInfo:
    reply = msgspec.structs.replace(
        status(bytes(32)), replica=replica, active_sessions=active, max_sessions=max_sessions, draining=draining
    )
    return ServerInfo(ServerKeys("app", "model", replica), reply)


def test_robots_placing_themselves_on_one_view_of_the_fleet_spread_over_it() -> None:
    # A failover: every robot of a dead replica sees the same two survivors at once.
    fleet = [info("a", 50), info("b", 51), info("c", 60)]
    firsts = Counter(first_choice(fleet)[0].keys.replica for _ in range(2000))
    assert 0.4 < firsts["a"] / 2000 < 0.6, firsts  # not all on the one with a session fewer
    assert firsts["c"] == 0  # ten sessions more of 100: never first
    assert [s.keys.replica for s in first_choice(fleet)][1:] in (["b", "c"], ["a", "c"])
    assert [s.keys.replica for s in first_choice([info("a", 0, draining=True), info("b", 5)])] == ["a", "b"]


def test_a_failover_on_an_old_view_draws_among_every_live_replica_of_it() -> None:
    # The robots of a dead replica fail over to the survivors of their last discovery, made long
    # before (or in mid start-up): one survivor had a queue then, another fewer sessions.
    queued = msgspec.structs.replace(info("a", 50).status, queue_wait_ms=120.0)
    fleet = [ServerInfo(ServerKeys("app", "model", "a"), queued), info("b", 50), info("c", 20)]
    fleet.append(info("d", 0, draining=True))
    fresh = Counter(first_choice(fleet)[0].keys.replica for _ in range(3000))
    old = Counter(first_choice(fleet, recent=False)[0].keys.replica for _ in range(3000))
    assert fresh == {"c": 3000}  # a view of now: the emptiest replica
    assert old.keys() == {"a", "b", "c"}, old  # never the draining one
    assert all(800 < old[name] < 1200 for name in "abc"), old  # that load is long gone: as many on each


class CountingClient(PolicyClient):
    """A client that counts its discoveries (event loop)."""

    discoveries = 0

    async def discover(self, *, app: str | None = None, model: str | None = None, timeout: float = 2.0) -> Any:
        self.discoveries += 1
        return await super().discover(app=app, model=model, timeout=timeout)


async def test_a_failover_tries_the_replicas_known_without_discovering_again() -> None:
    async with three_replicas() as router_port, open_zsession(client_settings(router_port)) as zsession:
        client = CountingClient(zsession, "robot")
        with anyio.fail_after(10):
            while len(servers := await client.discover(app="spread")) < 3:  # noqa: ASYNC110 - joins have no event
                await anyio.sleep(0.05)
        policy = servers[0].status.policy
        gone, discoveries = servers[0].keys, client.discoveries
        session = await client.connect_best(
            features=policy.features, fps=policy.fps, app="spread", settle=False, avoid=(gone,)
        )
        try:
            assert session.server.keys != gone
            assert session.server.keys in {s.keys for s in servers}
            assert client.discoveries == discoveries  # straight to a replica it knew
            # Without ``avoid`` (a first connect), it discovers as always.
            fresh = CountingClient(zsession, "robot-2")
            other = await fresh.connect_best(features=policy.features, fps=policy.fps, app="spread", settle=False)
            await other.close()
            assert fresh.discoveries == 1
        finally:
            await session.close()
