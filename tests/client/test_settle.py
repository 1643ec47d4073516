"""Settling without a herd (`servo.client.settle`): the rule on its own, then whole fleets of fake
robots running the real procedure in virtual time (trio's MockClock), seeded."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field

import anyio
import pytest
from trio.testing import MockClock

from servo.client import PolicyClient
from servo.client.discovery import ServerInfo
from servo.client.settle import HOLD_DOWN_S, HoldDown, imbalance, look_window, settle
from servo.server.manifest import Manifest
from servo.transport import ZenohSettings, open_zsession
from servo.wire import ServerKeys
from tests.client.test_placement import info as replica_info
from tests.support import client_settings, free_port, make_manifest, running_server

#: What a look and a move take in the fake fleet (s): a status query, a handshake, and the edge
#: closing its old session between two requests after it switched.
LOOK_S, OPEN_S, CLOSE_S = 0.01, 0.03, 0.05


def keys(name: str) -> ServerKeys:
    return ServerKeys("app", "model", name)


def info(replica: str, active: int, *, draining: bool = False) -> ServerInfo:
    """A replica's status as discovery returns it, with room for 400 sessions."""
    return replica_info(replica, active, max_sessions=400, draining=draining)


def excess(*sessions: int) -> int:
    """The excess a robot on the first of replicas holding ``sessions`` sees."""
    seen = imbalance(keys("r0"), [info(f"r{i}", count) for i, count in enumerate(sessions)])
    assert seen is not None
    return seen.excess


def test_the_excess_is_what_must_leave_for_every_replica_to_be_within_one() -> None:
    seen = imbalance(keys("a"), [info("a", 10), info("b", 0)])
    assert seen is not None
    assert (seen.here, seen.excess, seen.target.keys.replica, seen.chance) == (10, 5, "b", 0.5)
    three = imbalance(keys("a"), [info("a", 150), info("b", 150), info("c", 0)])
    assert three is not None
    assert (three.excess, three.target.keys.replica) == (50, "c")  # 100 each: a third of a's robots
    assert excess(2, 0) == 1
    assert excess(5, 4) == 0
    assert excess(3, 2, 2) == 0
    assert excess(3, 2, 1) == 1  # a and c differ by two
    assert imbalance(keys("a"), [info("b", 4)]) is None  # its replica is gone: stop looking
    assert imbalance(keys("a"), [info("a", 5), info("b", 0, draining=True)]) is None  # nowhere else to go


def test_the_look_window_grows_with_the_crowd() -> None:
    assert look_window(2) == 1.0
    assert look_window(100) == pytest.approx(3.0)
    assert look_window(10_000) == 15.0


@dataclass
class Fleet:
    """Replicas' session counts as their status would show them, and every move made."""

    sessions: Counter[str]
    #: (virtual time, robot, from, to) of every move.
    moves: list[tuple[float, int, str, str]] = field(default_factory=list)
    #: The share of looks from which one replica is missing (its status answered too late).
    partial: float = 0.0
    draws: random.Random = field(default_factory=lambda: random.Random(7))

    def view(self) -> list[ServerInfo]:
        view = [info(name, count) for name, count in sorted(self.sessions.items())]
        if self.draws.random() < self.partial:
            view.pop(self.draws.randrange(len(view)))
        return view

    async def robot(self, index: int, replica: str, seed: int, rounds: int) -> None:
        """One edge: settles after its session opened and again after each move (`RemoteEngine`)."""
        rng = random.Random(seed * 1_000_003 + index)
        hold = HoldDown()
        mine = keys(replica)

        async def look() -> list[ServerInfo] | None:
            await anyio.sleep(LOOK_S)
            return self.view()

        async def move(target: ServerInfo) -> ServerKeys | None:
            nonlocal mine
            await anyio.sleep(OPEN_S)
            was, now = mine.replica, target.keys.replica
            self.sessions[now] += 1
            self.moves.append((anyio.current_time(), index, was, now))
            mine = target.keys
            await anyio.sleep(CLOSE_S)
            self.sessions[was] -= 1
            return target.keys

        for _ in range(rounds):
            before = mine
            await settle(mine, look, move, hold, once=True, rng=rng)
            if mine == before:
                return


def run_fleet(robots: int, seed: int, replicas: tuple[str, ...] = ("a", "b"), partial: float = 0.0) -> Fleet:
    """``robots`` robots on replica a, the others empty (they just appeared): everyone settles."""
    fleet = Fleet(Counter({replicas[0]: robots, **dict.fromkeys(replicas[1:], 0)}), partial=partial)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for index in range(robots):
                tg.start_soon(fleet.robot, index, replicas[0], seed, 8)

    anyio.run(main, backend="trio", backend_options={"clock": MockClock(autojump_threshold=0)})
    return fleet


def moved_back_within(fleet: Fleet, seconds: float) -> int:
    """Moves back to the replica a robot left less than ``seconds`` before."""
    last: dict[int, tuple[float, str]] = {}
    back = 0
    for at, robot, was, now in fleet.moves:
        if robot in last and last[robot][1] == now and at - last[robot][0] < seconds:
            back += 1
        last[robot] = (at, was)
    return back


@pytest.mark.parametrize("seed", range(20))
def test_two_robots_one_move(seed: int) -> None:
    fleet = run_fleet(2, seed)
    assert len(fleet.moves) == 1, fleet.moves
    assert fleet.sessions == Counter({"a": 1, "b": 1})


@pytest.mark.parametrize("seed", range(3))
def test_three_hundred_robots_move_as_many_as_needed_and_never_back(seed: int) -> None:
    fleet = run_fleet(300, seed)
    needed = 300 - math.ceil(300 / 2)
    assert len(fleet.moves) == needed, (len(fleet.moves), fleet.sessions)
    assert moved_back_within(fleet, HOLD_DOWN_S) == 0
    assert max(Counter(robot for _, robot, _, _ in fleet.moves).values()) == 1
    assert fleet.sessions == Counter({"a": 150, "b": 150})


def test_looks_that_miss_a_replica_do_not_end_the_settling() -> None:
    fleet = run_fleet(300, 0, partial=0.3)  # a busy replica's status often comes too late
    assert len(fleet.moves) == 150
    assert fleet.sessions == Counter({"a": 150, "b": 150})


def test_a_third_replica_draws_a_third_of_each() -> None:
    fleet = run_fleet(90, 0, ("a", "b", "c"))
    assert len(fleet.moves) == 60, fleet.sessions
    assert sorted(fleet.sessions.values()) == [30, 30, 30]


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_replica_that_appears_draws_half_of_a_small_fleet_and_nobody_moves_back() -> None:
    """Real replicas behind a router: four robots on r0, then r1 starts; each robot settles as a
    streaming edge does (`PolicyClient.rebalance`, switching at the first move, then again)."""
    router_port = free_port()

    def replica(name: str) -> Manifest:
        return make_manifest(
            free_port(),
            zenoh=f'mode = "peer"\nconnect = ["tcp/127.0.0.1:{router_port}"]',
            extra=f'[serving]\napp = "settle"\nreplica = "{name}"\nmax_sessions = 8\n'
            "[security]\nlisten_beside_router = true",  # peers beside the router, on purpose
        )

    router = ZenohSettings(mode="router", listen=[f"tcp/127.0.0.1:{router_port}"])
    moves: list[tuple[float, int, str, str]] = []
    async with open_zsession(router), running_server(replica("r0")), open_zsession(client_settings(router_port)) as z:
        probe = PolicyClient(z, "probe")
        await eventually_found(probe, 1)
        policy = (await probe.discover(app="settle"))[0].status.policy
        clients = [PolicyClient(z, f"robot-{i}") for i in range(4)]
        sessions = [
            await c.connect_best(features=policy.features, fps=policy.fps, app="settle", settle=False) for c in clients
        ]
        try:
            async with running_server(replica("r1")):
                await eventually_found(probe, 2)

                async def edge(i: int) -> None:
                    client = clients[i]
                    while moved := await client.rebalance(
                        sessions[i], features=policy.features, fps=policy.fps, app="settle"
                    ):
                        was, now = sessions[i].server.keys.replica, moved.server.keys.replica
                        moves.append((anyio.current_time(), i, was, now))
                        await sessions[i].close()
                        sessions[i] = moved

                with anyio.fail_after(60):
                    async with anyio.create_task_group() as tg:
                        for i in range(4):
                            tg.start_soon(edge, i)
                held = Counter(session.server.keys.replica for session in sessions)
        finally:
            for session in sessions:
                await session.close()
    assert held == Counter({"r0": 2, "r1": 2}), moves
    fleet = Fleet(held, moves)
    assert moved_back_within(fleet, HOLD_DOWN_S) == 0, moves
    assert len(moves) >= 2


async def eventually_found(client: PolicyClient, replicas: int) -> None:
    """Wait until discovery sees ``replicas`` replicas (a join has no event to wait on)."""
    with anyio.fail_after(20):
        while len(await client.discover(app="settle")) < replicas:  # noqa: ASYNC110 - see the docstring
            await anyio.sleep(0.05)
