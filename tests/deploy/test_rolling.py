"""`Deployment.resettled`: a rolling restart drains the next replica once edges are back on the restarted one."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from servo.deploy.ray import Deployment, RayOptions, Replica

pytestmark = pytest.mark.anyio


class _Method:
    """An actor method as the driver calls it: ``method.remote()`` gives something to await."""

    def __init__(self, fn: Callable[[], int]) -> None:
        self._fn = fn

    def remote(self) -> Awaitable[int]:
        async def call() -> int:
            return self._fn()

        return call()


class _Actor:
    def __init__(self, counts: list[int], index: int) -> None:
        self.sessions = _Method(lambda: counts[index])


def replica(counts: list[int], index: int) -> Replica:
    actor: Any = _Actor(counts, index)  # stands in for the Ray actor handle
    return Replica(index, f"r-{index}", actor)


def deployment(counts: list[int], timeout_s: float) -> Deployment:
    replicas = [replica(counts, i) for i in range(len(counts))]
    return Deployment(replicas, RayOptions(resettle_timeout_s=timeout_s), owns_ray=False)


async def test_waits_until_the_restarted_replica_holds_its_share() -> None:
    counts = [0, 6, 6]  # 12 sessions over 3 replicas: 4 each once settled
    plan = deployment(counts, timeout_s=30.0)
    held: list[tuple[int, int]] = []

    async def settle() -> None:
        held.append(await plan.resettled(plan.replicas[0]))

    async with anyio.create_task_group() as tg:
        tg.start_soon(settle)
        for _ in range(4):  # edges move one by one
            await anyio.wait_all_tasks_blocked()
            assert not held, "returned before the replica held its share"
            counts[0] += 1
            counts[1 + counts[0] % 2] -= 1
    assert held == [(4, 4)]


@pytest.mark.parametrize(("counts", "expected"), [([0, 0, 0], (0, 0)), ([0, 1, 0], (0, 0))])
async def test_no_wait_when_there_is_nothing_to_settle(counts: list[int], expected: tuple[int, int]) -> None:
    with anyio.fail_after(5):
        assert await deployment(counts, timeout_s=30.0).resettled(replica(counts, 0)) == expected


async def test_gives_up_after_the_timeout() -> None:
    counts = [0, 5, 5]
    plan = deployment(counts, timeout_s=0.3)
    with anyio.fail_after(5):
        assert await plan.resettled(plan.replicas[0]) == (0, 3)
