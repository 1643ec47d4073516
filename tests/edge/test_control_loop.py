"""ControlLoop: fixed rate, missed deadlines skipped (not accumulated), park through the limiter."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from servo.edge.control_loop import ControlLoop
from servo.edge.safety import SafetyLimiter
from servo.robots.sim import SimConfig, SimSO100
from tests.edge.fakes import ScriptedEngine, SpyRobot, wait_for

REST = np.array(SimConfig().initial_pose, dtype=np.float32)


@pytest.fixture
def robot() -> Iterator[SpyRobot]:
    sim = SimSO100(SimConfig(fps=50.0, cameras=(), initial_pose=(30.0, 0.0, 0.0, 0.0, 0.0, 50.0)))
    spy = SpyRobot(sim)
    spy.connect()
    yield spy
    spy.disconnect()


def run_loop(robot: SpyRobot, engine: ScriptedEngine, lateness: list[int] | None = None) -> ControlLoop:
    on_tick = None if lateness is None else (lambda tick, ns: lateness.append(ns))
    loop = ControlLoop(robot, engine, SafetyLimiter(robot.spec), on_tick=on_tick)  # type: ignore[arg-type]
    loop.start()
    return loop


def test_fixed_rate(robot: SpyRobot) -> None:
    hold = robot.read_state()
    engine = ScriptedEngine(lambda i: hold, until=40)
    lateness: list[int] = []
    loop = run_loop(robot, engine, lateness)
    try:
        assert engine.reached.wait(5.0)
    finally:
        loop.stop()
    assert loop.error is None
    assert not loop.running
    period = loop.period_ns
    span = engine.calls[39] - engine.calls[0]
    # Absolute deadlines: never faster than fps; ticks + skipped ticks account for the time.
    assert span >= 39 * period - 1_000_000
    assert abs(span / period - (39 + loop.missed_deadlines)) < 1.0
    assert loop.ticks >= 40
    assert loop.actions_executed == loop.ticks
    assert len(lateness) == loop.jitter.count() == loop.ticks
    assert loop.max_jitter_ns == max(abs(ns) for ns in lateness)
    assert engine.observations == loop.ticks


def test_missed_deadlines_are_counted_not_accumulated(robot: SpyRobot) -> None:
    hold = robot.read_state()
    period_s = 1 / robot.spec.fps

    def slow(index: int) -> None:
        if index == 5:
            time.sleep(3.5 * period_s)  # one tick overruns by 3.5 periods

    engine = ScriptedEngine(lambda i: hold, until=15, on_tick=slow)
    lateness: list[int] = []
    loop = run_loop(robot, engine, lateness)
    try:
        assert engine.reached.wait(5.0)
    finally:
        loop.stop()
    assert loop.missed_deadlines >= 3
    period = loop.period_ns
    start = engine.calls[0]
    after = engine.calls[6:15]
    # No catch-up burst: the ticks after the slow one stay a period apart ...
    assert min(np.diff(after)) > 0.5 * period
    # ... and on the original grid, the skipped slots simply missing.
    slots = [(t - start) / period for t in after]
    assert slots[0] >= 8.5
    assert all(abs(s - round(s)) < 0.25 for s in slots)
    assert max(lateness[6:15]) < 0.5 * period


def test_park_drives_to_rest_through_the_limiter(robot: SpyRobot) -> None:
    away = robot.read_state()
    engine = ScriptedEngine(lambda i: away)  # the policy would keep the arm where it is
    loop = run_loop(robot, engine)
    try:
        assert loop.park(REST, tolerance=1.0, timeout=5.0)
    finally:
        loop.stop()
    commands = np.vstack([away, *robot.commands])
    max_step = np.asarray(robot.spec.max_velocity, np.float32) / np.float32(robot.spec.fps)
    assert np.all(np.abs(np.diff(commands, axis=0)) <= max_step + 1e-4)  # a ramp, never a step
    np.testing.assert_allclose(robot.commands[-1], REST, atol=1e-4)
    assert np.max(np.abs(robot.read_state() - REST)) <= 1.0
    assert loop.actions_executed < loop.ticks  # park ticks are not policy actions


def test_hold_sends_nothing(robot: SpyRobot) -> None:
    engine = ScriptedEngine(lambda i: None, until=10)
    loop = run_loop(robot, engine)
    try:
        assert engine.reached.wait(5.0)
    finally:
        loop.stop()
    assert robot.commands == []
    assert loop.actions_executed == 0
    assert loop.last_command is None


def test_an_engine_error_stops_the_loop_without_escaping(robot: SpyRobot) -> None:
    def broken(index: int) -> None:
        if index == 3:
            raise RuntimeError("engine bug")

    hold = robot.read_state()
    engine = ScriptedEngine(lambda i: hold, on_tick=broken)
    loop = run_loop(robot, engine)
    wait_for(lambda: not loop.running, 5.0, "the loop to stop")
    loop.stop()
    assert isinstance(loop.error, RuntimeError)
    assert loop.ticks == 3
