"""Observation intake lanes: spread over threads, one session in order on one lane, nothing lost."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np
import pytest

from servo.config import ConfigError
from servo.server import lanes as lanes_module
from servo.server.lanes import IntakeLanes, auto_lanes
from servo.server.manifest import parse_manifest
from tests.server.helpers import connected, open_on
from tests.server.policies import FixedComputePolicy
from tests.support import eventually, make_manifest, running_server

pytestmark = pytest.mark.anyio


@dataclass(frozen=True)
class FakeSample:
    """What `IntakeLanes` reads of a Zenoh sample: its key."""

    key_expr: str
    n: int


class Recorder:
    """``handle`` of the lanes under test: records (key, n, thread) of every sample, any thread."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int]] = []
        self.lock = threading.Lock()

    def __call__(self, sample: Any) -> None:
        with self.lock:
            self.seen.append((sample.key_expr, sample.n, threading.get_ident()))


def keys(count: int) -> list[str]:
    return [f"@servo/app/r0/robot-{i}/obs" for i in range(count)]


async def test_one_lane_works_on_the_callback_thread_itself() -> None:
    recorder = Recorder()
    lanes = IntakeLanes(recorder, 1)
    lanes(FakeSample("k", 0))  # type: ignore[arg-type]
    assert recorder.seen == [("k", 0, threading.get_ident())]
    lanes.close()


async def test_each_session_keeps_its_order_on_one_lane_and_sessions_spread() -> None:
    recorder = Recorder()
    lanes = IntakeLanes(recorder, 4)
    names = keys(16)
    try:
        for n in range(20):
            for key in names:
                lanes(FakeSample(key, n))  # type: ignore[arg-type]
        await eventually(lambda: len(recorder.seen) == 20 * len(names), what="every sample handled")
    finally:
        lanes.close()
    caller = threading.get_ident()
    for key in names:
        mine = [(n, thread) for k, n, thread in recorder.seen if k == key]
        assert [n for n, _ in mine] == list(range(20)), f"{key}: out of order"
        assert len({thread for _, thread in mine}) == 1, f"{key}: moved between lanes"
    threads = {thread for _, _, thread in recorder.seen}
    assert caller not in threads
    assert len(threads) > 1, "16 sessions all on one of 4 lanes"


async def test_a_full_lane_makes_the_callback_thread_work_and_nothing_is_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lanes_module, "LANE_DEPTH", 3)
    gate, busy = threading.Event(), threading.Event()
    recorder = Recorder()

    def handle(sample: Any) -> None:
        if sample.n == 0:
            busy.set()
            gate.wait(10)  # the lane's first sample holds it busy
        recorder(sample)

    lanes = IntakeLanes(handle, 2)
    try:
        lanes(FakeSample("k", 0))  # type: ignore[arg-type]
        assert busy.wait(10), "the lane never started"
        for n in range(1, 6):  # 1-3 wait in the lane, 4 and 5 find it full
            lanes(FakeSample("k", n))  # type: ignore[arg-type]
        caller = threading.get_ident()
        assert [(n, t) for _, n, t in recorder.seen] == [(4, caller), (5, caller)]
        gate.set()
        await eventually(lambda: len(recorder.seen) == 6, what="the held samples handled")
    finally:
        gate.set()
        lanes.close()
    assert sorted(n for _, n, _ in recorder.seen) == list(range(6))


async def test_a_failing_observation_costs_only_itself() -> None:
    recorder = Recorder()

    def handle(sample: Any) -> None:
        if sample.n == 1:
            raise RuntimeError("a bug")
        recorder(sample)

    lanes = IntakeLanes(handle, 2)
    try:
        for n in range(3):
            lanes(FakeSample("k", n))  # type: ignore[arg-type]
        await eventually(lambda: len(recorder.seen) == 2, what="the samples around the failing one")
    finally:
        lanes.close()
    assert [n for _, n, _ in recorder.seen] == [0, 2]


def test_lanes_are_sized_to_the_cores_and_checked() -> None:
    assert 1 <= auto_lanes() <= lanes_module.MAX_AUTO_LANES
    with pytest.raises(ValueError, match="lanes must be at least 1"):
        IntakeLanes(Recorder(), 0)
    with pytest.raises(ConfigError, match="intake_threads"):
        parse_manifest('[model]\nsource = "reference"\n[serving]\nintake_threads = 65\n')


@pytest.mark.parametrize("quality", [0, 90], ids=["raw", "jpeg90"])
async def test_a_server_with_three_lanes_answers_every_robot_from_its_own_observation(port: int, quality: int) -> None:
    cameras = {"front": (48, 64), "wrist": (24, 32)}
    manifest = make_manifest(port, extra="[serving]\nintake_threads = 3\n")
    async with running_server(manifest, policy=FixedComputePolicy(cameras=cameras)) as (_, ready):
        assert ready.paths["intake_threads"] == "3"

        async def robot(index: int) -> None:
            frames = {name: np.full((h, w, 3), 40 * index, np.uint8) for name, (h, w) in cameras.items()}
            async with connected(port, f"robot-{index}", jpeg_quality=quality) as client:
                session = await open_on(client, ready)
                for step in range(5):
                    state = np.full(6, index * 100 + step, np.float32)
                    chunk = await session.infer(state, frames, timeout=10)
                    np.testing.assert_allclose(chunk.chunk_robot[0], state)
                await session.close()

        async with anyio.create_task_group() as tg:
            for index in range(4):
                tg.start_soon(robot, index)
