"""The tick and its schedule (on a ThreadControlLoop): fixed rate, missed deadlines skipped (not
accumulated), park through the limiter, and the safety layer's refusal of non-finite targets."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import anyio
import numpy as np
import numpy.typing as npt
import pytest

from servo.edge.channel import Bell, ControlChannel, lateness_percentiles_ms
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
async def running(
    robot: SpyRobot, actions: ScriptedActions, channel: ControlChannel | None = None
) -> AsyncIterator[ThreadControlLoop]:
    channel = channel or ControlChannel.create(robot.spec.action_dim, shared=False)
    loop = ThreadControlLoop(channel, NoCameras(), robot, actions, SafetyLimiter(robot.spec), realtime=False)
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        try:
            yield loop
        finally:
            await loop.stop()


async def reached(actions: ScriptedActions) -> None:
    assert await anyio.to_thread.run_sync(actions.reached.wait, 5.0)


class Deadlines:
    """Each tick's deadline, recovered on the loop thread (as its ``on_tick``): start minus lateness.

    The loop notes a tick's lateness in the channel's histogram just before it asks for the
    tick's action, so the one new count there bounds that lateness to its bin (10 µs wide below
    10 ms, 1 ms above). However late a loaded machine runs a tick, its deadline is then known to
    half a bin, and the schedule's promise is checked on the deadlines themselves.
    """

    def __init__(self, channel: ControlChannel, period_ns: int) -> None:
        self._channel = channel
        self._seen = channel.lateness_counts()
        self.period_ns = period_ns
        self.late_ns: list[int] = []  # bin-midpoint estimate of each tick's lateness
        self.half_bin_ns: list[int] = []

    def __call__(self, index: int) -> None:
        counts = self._channel.lateness_counts()
        new = counts - self._seen
        self._seen = counts
        assert int(new.sum()) == 1, "one lateness per tick"
        points = lateness_percentiles_ms(new, [1.0], 1 << 62)
        assert points is not None
        upper_ns = round(points[0] * 1e6)
        half_bin = 5_000 if upper_ns <= 10_000_000 else 500_000
        self.late_ns.append(upper_ns - half_bin)
        self.half_bin_ns.append(half_bin)

    def slots(self, starts: list[int]) -> npt.NDArray[np.int64]:
        """Each tick's slot on the grid of the first tick's deadline (asserting it is on that grid)."""
        n = len(self.late_ns)
        deadlines = np.array(starts[:n], np.int64) - np.array(self.late_ns, np.int64)
        offsets = deadlines - deadlines[0]
        slots = np.round(offsets / self.period_ns).astype(np.int64)
        error = np.abs(offsets - slots * self.period_ns)
        allowed = np.array(self.half_bin_ns, np.int64) + self.half_bin_ns[0]
        assert np.all(error <= allowed), f"deadlines off the grid by {error.tolist()} ns (allowed {allowed.tolist()})"
        return slots


async def test_fixed_rate(robot: SpyRobot) -> None:
    channel = ControlChannel.create(robot.spec.action_dim, shared=False)
    deadlines = Deadlines(channel, round(1e9 / robot.spec.fps))
    actions = ScriptedActions(lambda i: AWAY, until=40, on_tick=deadlines)
    async with running(robot, actions, channel) as loop:
        await reached(actions)
    stats = loop.statistics()
    assert not loop.running
    assert loop.error == ""
    # Absolute deadlines, one grid: never two ticks in one period (never faster than fps), and
    # every slot without a tick (a loaded machine ran one late) is counted as missed.
    slots = deadlines.slots(actions.calls)[:40]
    assert np.all(np.diff(slots) >= 1)
    assert slots[-1] - 39 <= stats.missed_deadlines
    assert stats.ticks >= 40
    assert stats.actions_executed == stats.commands_sent == stats.ticks
    assert int(loop.channel.lateness_counts().sum()) == stats.ticks  # every tick's lateness, bounded memory
    assert stats.lateness_ms["p50"] is not None
    assert stats.lateness_ms["p50"] <= stats.lateness_ms["p99"] <= stats.lateness_ms["max"]  # type: ignore[operator]


async def test_missed_deadlines_are_counted_not_accumulated(robot: SpyRobot) -> None:
    period_ns = round(1e9 / robot.spec.fps)
    channel = ControlChannel.create(robot.spec.action_dim, shared=False)
    deadlines = Deadlines(channel, period_ns)

    def on_tick(index: int) -> None:
        deadlines(index)
        if index == 5:
            time.sleep(3.5 * period_ns / 1e9)  # one tick overruns by 3.5 periods

    actions = ScriptedActions(lambda i: REST, until=15, on_tick=on_tick)
    async with running(robot, actions, channel) as loop:
        await reached(actions)
    missed = loop.statistics().missed_deadlines
    # Every tick's deadline on the original grid, never two ticks in one slot (no catch-up
    # burst); the tick after the slow one waits for the first slot after the overrun, the
    # skipped slots simply missing, and counted.
    slots = deadlines.slots(actions.calls)[:15]
    assert np.all(np.diff(slots) >= 1)
    assert slots[6] - slots[5] >= 4
    assert missed >= 3
    assert slots[14] - 14 <= missed


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
