"""A robot that stops giving fresh states (a dead ROS 2 driver): the loop commands nothing from an
old state, faults once, and when states resume starts again from where the robot really is."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import anyio
import numpy as np
import pytest

from servo.edge.channel import ControlChannel
from servo.edge.control_loop import ThreadControlLoop
from servo.edge.safety import SafetyLimiter
from servo.robots import NoCameras, RobotFault
from servo.robots.sim import SimConfig, SimSO100
from tests.edge.fakes import FloatArray, ScriptedActions, SpyRobot
from tests.support import eventually

pytestmark = pytest.mark.anyio

START = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 50.0], np.float32)
AWAY = np.array([40.0, -30.0, 20.0, 0.0, 0.0, 50.0], np.float32)
MOVED = np.array([-50.0, 40.0, -40.0, 30.0, 0.0, 20.0], np.float32)


class BlindRobot(SpyRobot):
    """A SpyRobot whose states can be cut off (`blind` set): read_state raises RobotFault."""

    def __init__(self, sim: SimSO100) -> None:
        super().__init__(sim)
        self.blind = threading.Event()
        self.faults = 0
        self.commands_when_blind = 0

    def read_state(self) -> FloatArray:
        if self.blind.is_set():
            self.faults += 1
            raise RobotFault("joint states stopped arriving")
        return super().read_state()

    def send_action(self, target: FloatArray) -> None:
        self.commands_when_blind += self.blind.is_set()
        super().send_action(target)


@pytest.fixture
def robot() -> Iterator[BlindRobot]:
    sim = SimSO100(SimConfig(fps=50.0, cameras=(), initial_pose=tuple(START.tolist()), time_constant_s=0.02))
    spy = BlindRobot(sim)
    yield spy
    spy.disconnect()


MAX_STEP = np.asarray(SimConfig().max_velocity, np.float32) / np.float32(50.0)


@dataclass
class Blinded:
    """What happened around a stretch without states: commands before it, the loop, the park."""

    loop: ThreadControlLoop
    actions: ScriptedActions
    sent: int
    taken: int
    parked: bool


async def blind_then_park(robot: BlindRobot, meanwhile: Callable[[FloatArray], None]) -> Blinded:
    """Drive the arm away, cut its states (ten blind ticks), let ``meanwhile(last command)`` move
    it, give the states back and park it at the start pose."""
    actions = ScriptedActions(lambda i: AWAY, until=10)
    channel = ControlChannel.create(robot.spec.action_dim, shared=False)
    loop = ThreadControlLoop(channel, NoCameras(), robot, actions, SafetyLimiter(robot.spec), realtime=False)
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        await anyio.to_thread.run_sync(actions.reached.wait, 5.0)
        robot.blind.set()
        await eventually(lambda: loop.fault != "", 5, "the fault")
        sent, taken = len(robot.commands), len(actions.calls)
        seen = robot.faults
        await eventually(lambda: robot.faults >= seen + 10, 5, "ten blind ticks")
        meanwhile(robot.commands[sent - 1])
        robot.sim.step(5.0)
        robot.blind.clear()
        parked = await loop.park(START, tolerance=1.0, timeout=10.0)
        await loop.stop()
    return Blinded(loop, actions, sent, taken, parked)


async def test_no_command_while_blind_then_the_park_starts_from_the_measured_pose(robot: BlindRobot) -> None:
    # Somebody moved the arm while nobody saw it (the driver restarted elsewhere).
    run = await blind_then_park(robot, lambda last: robot.sim.send_action(MOVED))
    assert run.parked
    assert "robot: joint states stopped arriving" in run.loop.fault
    assert robot.commands_when_blind == 0
    after = robot.commands[run.sent :]
    assert after, "the park commanded nothing"
    # The first command after the resume is one slew step from where the arm was measured, not
    # from the last command sent before the states stopped.
    assert np.all(np.abs(after[0] - MOVED) <= MAX_STEP + 1e-3), (after[0], MOVED)
    ramp = np.vstack([MOVED, *after])
    assert np.all(np.abs(np.diff(ramp, axis=0)) <= MAX_STEP + 1e-3)
    assert len(run.actions.calls) == run.taken  # no policy action after the fault


async def test_a_driver_that_recovers_with_the_arm_in_place_goes_on_from_the_last_command(
    robot: BlindRobot,
) -> None:
    """The arm is within one slew step of the command it held while states stopped: the ramp to the
    rest pose goes on from that command, every step within the slew limit."""

    def settle_short(last: FloatArray) -> None:
        # Short of the command it holds, by less than one slew step, on the side of the rest pose: a
        # restart from the measured pose would step almost two steps from `last`.
        robot.sim.send_action(last + np.float32(0.9) * MAX_STEP * np.sign(START - last).astype(np.float32))

    run = await blind_then_park(robot, settle_short)
    assert run.parked
    ramp = np.vstack(robot.commands[run.sent - 1 :])
    assert np.all(np.abs(np.diff(ramp, axis=0)) <= MAX_STEP + 1e-3)
