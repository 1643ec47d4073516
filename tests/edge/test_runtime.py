"""EdgeRuntime supervision: whatever stops the run, the arm is parked before disconnecting."""

from __future__ import annotations

import threading

import anyio
import pytest
from anyio.abc import TaskStatus

from servo.edge.config import EdgeConfig
from servo.edge.engine import EngineBase
from servo.edge.observation import ObservationInput
from servo.edge.runtime import EdgeRuntime, RunOptions
from servo.robots import SimConfig, SimSO100

pytestmark = pytest.mark.anyio


class CrashingEngine(EngineBase):
    """Starts fine, then raises once the control loop has delivered a few observations."""

    def __init__(self, config: EdgeConfig, spec: object, *, crash_after: int) -> None:
        super().__init__(config, spec)  # type: ignore[arg-type]
        self._crash_after = crash_after
        self._seen = 0
        self._enough = threading.Event()

    def notify_observation(self, obs: ObservationInput) -> None:
        super().notify_observation(obs)
        self._seen += 1
        if self._seen >= self._crash_after:
            self._enough.set()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        assert await anyio.to_thread.run_sync(self._enough.wait, 10)
        raise RuntimeError("engine bug")


async def test_engine_crash_after_start_parks_the_arm_and_reports_dead() -> None:
    robot = SimSO100(SimConfig(cameras=(), initial_pose=(10.0, -80.0, 80.0, 50.0, 5.0, 30.0)))
    engine = CrashingEngine(EdgeConfig(), robot.spec, crash_after=5)
    with anyio.fail_after(20):
        summary = await EdgeRuntime(robot, engine, EdgeConfig(), RunOptions(duration_s=15)).run()
    assert summary.final_state == "dead"
    assert "engine crashed" in summary.stop_reason
    assert summary.parked


async def test_engine_failing_before_start_propagates_and_nothing_moves() -> None:
    class FailsAtStart(EngineBase):
        async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            raise RuntimeError("cannot start")

    robot = SimSO100(SimConfig(cameras=()))
    runtime = EdgeRuntime(robot, FailsAtStart(EdgeConfig(), robot.spec), EdgeConfig(), RunOptions(duration_s=5))
    with pytest.RaisesGroup(pytest.RaisesExc(RuntimeError, match="cannot start"), flatten_subgroups=True):
        await runtime.run()
    assert runtime.loop is None
    assert not robot.is_connected
