"""The tick and its schedule (on a ThreadControlLoop): fixed rate, missed deadlines skipped (not
accumulated), park through the limiter, and the safety layer's refusal of non-finite targets."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import anyio
import numpy as np
import pytest

from servo.edge.channel import Bell, ControlChannel
from servo.edge.control_loop import ThreadControlLoop
from servo.edge.errors import EdgeStartError
from servo.edge.safety import SafetyLimiter
from servo.edge.ticker import Ticker
from servo.robots import NoCameras
from servo.robots.sim import SimConfig, SimSO100
from tests.edge.fakes import ScriptedActions, SpyRobot
from tests.support import eventually

pytestmark = pytest.mark.anyio

REST = np.array(SimConfig().initial_pose, dtype=np.float32)
AWAY = np.array([30.0, 0.0, 0.0, 0.0, 0.0, 50.0], np.float32)


@pytest.fixture
def robot() -> Iterator[SpyRobot]:
    sim = SimSO100(SimConfig(fps=50.0, cameras=(), initial_pose=tuple(AWAY.tolist())))
    spy = SpyRobot(sim)
    yield spy
    spy.disconnect()


@asynccontextmanager
async def running(robot: SpyRobot, actions: ScriptedActions) -> AsyncIterator[ThreadControlLoop]:
    channel = ControlChannel.create(robot.spec.action_dim, shared=False)
    loop = ThreadControlLoop(channel, NoCameras(), robot, actions, SafetyLimiter(robot.spec), realtime=False)
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        try:
            yield loop
        finally:
            await loop.stop()


async def reached(actions: ScriptedActions) -> None:
    assert await anyio.to_thread.run_sync(actions.reached.wait, 5.0)


async def test_fixed_rate(robot: SpyRobot) -> None:
    actions = ScriptedActions(lambda i: AWAY, until=40)
    async with running(robot, actions) as loop:
        await reached(actions)
    stats = loop.statistics()
    assert not loop.running
    assert loop.error == ""
    period = round(1e9 / robot.spec.fps)
    span = actions.calls[39] - actions.calls[0]
    # Absolute deadlines: never faster than fps; ticks + skipped ticks account for the time.
    assert span >= 39 * period - 1_000_000
    assert abs(span / period - (39 + stats.missed_deadlines)) < 1.0
    assert stats.ticks >= 40
    assert stats.actions_executed == stats.commands_sent == stats.ticks
    assert int(loop.channel.lateness_counts().sum()) == stats.ticks  # every tick's lateness, bounded memory
    assert stats.lateness_ms["p50"] is not None
    assert stats.lateness_ms["p50"] <= stats.lateness_ms["p99"] <= stats.lateness_ms["max"]  # type: ignore[operator]


async def test_missed_deadlines_are_counted_not_accumulated(robot: SpyRobot) -> None:
    period_s = 1 / robot.spec.fps

    def slow(index: int) -> None:
        if index == 5:
            time.sleep(3.5 * period_s)  # one tick overruns by 3.5 periods

    actions = ScriptedActions(lambda i: REST, until=15, on_tick=slow)
    async with running(robot, actions) as loop:
        await reached(actions)
    assert loop.statistics().missed_deadlines >= 3
    period = round(1e9 / robot.spec.fps)
    start = actions.calls[0]
    after = actions.calls[6:15]
    # No catch-up burst: the ticks after the slow one stay a period apart ...
    assert min(np.diff(after)) > 0.5 * period
    # ... and on the original grid, the skipped slots simply missing.
    slots = [(t - start) / period for t in after]
    assert slots[0] >= 8.5
    assert all(abs(s - round(s)) < 0.25 for s in slots)


async def test_park_drives_to_rest_through_the_limiter(robot: SpyRobot) -> None:
    actions = ScriptedActions(lambda i: AWAY)  # the policy would keep the arm where it is
    async with running(robot, actions) as loop:
        assert await loop.park(REST, tolerance=1.0, timeout=5.0)
    commands = np.vstack([AWAY, *robot.commands])
    max_step = np.asarray(robot.spec.max_velocity, np.float32) / np.float32(robot.spec.fps)
    assert np.all(np.abs(np.diff(commands, axis=0)) <= max_step + 1e-4)  # a ramp, never a step
    np.testing.assert_allclose(robot.commands[-1], REST, atol=1e-4)
    assert np.max(np.abs(robot.sim.position - REST)) <= 1.0
    stats = loop.statistics()
    assert stats.actions_executed < stats.commands_sent  # park ticks are not policy actions


async def test_hold_sends_nothing(robot: SpyRobot) -> None:
    actions = ScriptedActions(lambda i: None, until=10)
    async with running(robot, actions) as loop:
        await reached(actions)
    assert robot.commands == []
    assert loop.statistics().actions_executed == 0


async def test_a_non_finite_target_is_never_sent(robot: SpyRobot) -> None:
    """The safety layer refuses NaN (no clamp can fix it): the loop holds the last safe command,
    latches a fault, keeps ticking and still parks."""
    bad = AWAY.copy()
    bad[2] = np.nan
    actions = ScriptedActions(lambda i: bad if i >= 5 else AWAY, until=6)
    async with running(robot, actions) as loop:
        await reached(actions)
        await eventually(lambda: loop.fault != "", 2, "the fault")
        sent = len(robot.commands)
        ticks = loop.statistics().ticks
        await eventually(lambda: loop.statistics().ticks >= ticks + 5, 2, "more ticks")
        assert len(robot.commands) == sent  # held: nothing sent since the fault
        assert await loop.park(REST + 1.0, tolerance=0.5, timeout=5.0)  # parking still works
    assert sent == 5
    assert all(np.isfinite(command).all() for command in robot.commands)
    assert "policy action refused: target has non-finite values" in loop.fault
    assert len(actions.calls) == 6  # after the fault no more actions were taken


async def test_an_action_source_error_ends_the_loop_and_says_why(robot: SpyRobot) -> None:
    def broken(index: int) -> None:
        if index == 3:
            raise RuntimeError("engine bug")

    actions = ScriptedActions(lambda i: REST, on_tick=broken)
    async with running(robot, actions) as loop:
        await eventually(lambda: not loop.running, 5.0, "the loop to end")
    assert "engine bug" in loop.error
    assert "engine bug" in loop.fault
    assert loop.statistics().ticks == 3
    assert not robot.sim.is_connected  # the loop disconnected what it connected


async def test_a_robot_that_cannot_connect_is_a_start_error() -> None:
    class Broken(SpyRobot):
        def connect(self) -> None:
            raise OSError("no such port")

    robot = Broken(SimSO100(SimConfig(cameras=())))
    channel = ControlChannel.create(robot.spec.action_dim, shared=False)
    loop = ThreadControlLoop(channel, NoCameras(), robot, ScriptedActions(lambda i: None), SafetyLimiter(robot.spec))
    with pytest.raises(EdgeStartError, match=r"the control loop did not start: .*no such port"):
        await loop.run()
    assert not loop.running


def test_an_orphaned_ticker_parks_the_arm_then_stops(robot: SpyRobot) -> None:
    """What the control process does when the edge is gone (its stdin closed)."""
    read_fd, write_fd = os.pipe()
    channel = ControlChannel.create(robot.spec.action_dim, shared=False)
    ticker = Ticker(robot, ScriptedActions(lambda i: AWAY), SafetyLimiter(robot.spec), channel, Bell(write_fd))
    robot.connect()
    try:
        ticker.start()
        ticker.orphan(tolerance=1.0, timeout_s=10.0)
        ticker.run(lambda: False)  # returns once parked
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert np.max(np.abs(robot.read_state() - REST)) <= 1.0
    assert robot.commands  # driven there through the limiter, not left where it was
    np.testing.assert_allclose(robot.commands[-1], REST, atol=1e-4)
