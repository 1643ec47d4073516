"""EdgeRuntime supervision: whatever stops the run, the arm is parked if the control loop still
ticks, and the summary tells the truth (engine crash, a NaN chunk, the control process dying)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio
import numpy as np
import pytest
from anyio.abc import TaskStatus

from servo.edge.channel import LoopState
from servo.edge.config import EdgeConfig
from servo.edge.control_process import ProcessControlLoop
from servo.edge.engine import LOCAL_SESSION, EngineBase, Produced
from servo.edge.pipeline import PipelineConfig
from servo.edge.runtime import EdgeRuntime, RunOptions
from servo.recording import read_recording
from servo.robots import RobotDescription
from servo.wire import decode_tensor
from tests.support import eventually

pytestmark = pytest.mark.anyio

AWAY = [10.0, -80.0, 80.0, 50.0, 5.0, 30.0]


def sim(**options: object) -> RobotDescription:
    return RobotDescription("sim", {"cameras": "none", "initial_pose": AWAY, **options})


class CrashingEngine(EngineBase):
    """Starts fine, then raises once the control loop has published a few observations."""

    def __init__(self, config: EdgeConfig, robot: RobotDescription, *, crash_after: int) -> None:
        super().__init__(config, robot.spec())
        self._crash_after = crash_after

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        seen: set[int] = set()
        while len(seen) < self._crash_after:
            obs = self.latest_observation()
            if obs is not None:
                seen.add(obs.mono_ns)
            await anyio.sleep(0.005)
        raise RuntimeError("engine bug")


class ChunkEngine(EngineBase):
    """Merges the given chunks (one per observation), then idles."""

    def __init__(self, config: EdgeConfig, robot: RobotDescription, chunks: list[np.ndarray]) -> None:
        super().__init__(config, robot.spec())
        self.chunks = chunks

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        for seq, chunk in enumerate(self.chunks):
            obs = await self.wait_until_needed()
            request = self.pipeline.snapshot(obs)
            self.merge(request, Produced(chunk, chunk, LOCAL_SESSION, seq, 0.0), time.monotonic_ns())
        await anyio.sleep_forever()


async def test_engine_crash_after_start_parks_the_arm_and_reports_dead() -> None:
    robot = sim()
    engine = CrashingEngine(EdgeConfig(), robot, crash_after=5)
    with anyio.fail_after(30):
        summary = await EdgeRuntime(robot, engine, EdgeConfig(), RunOptions(duration_s=15)).run()
    assert summary.final_state == "dead"
    assert "engine crashed" in summary.stop_reason
    assert summary.parked
    assert summary.control_loop == "ProcessControlLoop"


async def test_engine_failing_before_start_propagates_and_nothing_moves() -> None:
    class FailsAtStart(EngineBase):
        async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            raise RuntimeError("cannot start")

    robot = sim()
    runtime = EdgeRuntime(robot, FailsAtStart(EdgeConfig(), robot.spec()), EdgeConfig(), RunOptions(duration_s=5))
    with pytest.RaisesGroup(pytest.RaisesExc(RuntimeError, match="cannot start"), flatten_subgroups=True):
        await runtime.run()
    assert runtime.loop is not None
    assert runtime.loop.channel.state is LoopState.STARTING  # the control loop never started


async def test_a_nan_chunk_is_never_sent_the_arm_is_parked_and_the_summary_says_so(tmp_path: Path) -> None:
    """A non-finite chunk merged into the shared queue: the control process refuses it, holds its
    last safe command and faults; the runtime parks the arm; DEAD, with the fault in the summary."""
    robot = sim()
    good = np.tile(np.asarray(AWAY, np.float32), (20, 1))
    good[:, 0] += np.linspace(0, 5, 20, dtype=np.float32)
    bad = good.copy()
    bad[:, 3] = np.nan
    config = EdgeConfig(pipeline=PipelineConfig(rtc=False, buffer_time_s=0.2))
    engine = ChunkEngine(config, robot, [good, bad])
    record = tmp_path / "run.servo"
    with anyio.fail_after(30):
        summary = await EdgeRuntime(robot, engine, config, RunOptions(duration_s=20, record_path=str(record))).run()
    assert summary.final_state == "dead"
    assert summary.stop_reason.startswith("control fault: policy action refused: target has non-finite values")
    assert summary.fault in summary.stop_reason
    assert summary.parked
    assert summary.chunks_received == 2
    frames = read_recording(record).frames
    sent = [np.array(decode_tensor(f.action, dtype="float32")) for f in frames if f.action is not None]
    assert all(np.isfinite(values).all() for values in sent)
    sources = [f.source for f in frames]
    assert sources.count("policy") == 20  # the good chunk, then nothing of the bad one
    assert "park" in sources


async def test_the_control_process_dying_ends_the_run_at_once_and_truthfully() -> None:
    robot = sim()
    engine = CrashingEngine(EdgeConfig(), robot, crash_after=10**9)  # never crashes
    runtime = EdgeRuntime(robot, engine, EdgeConfig(), RunOptions(duration_s=60))
    result = []

    async def run() -> None:
        result.append(await runtime.run())

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await eventually(lambda: runtime.loop is not None and runtime.loop.running, 15, "the control loop")
            loop = runtime.loop
            assert isinstance(loop, ProcessControlLoop)
            assert loop.pid is not None
            killed = time.monotonic()
            os.kill(loop.pid, signal.SIGKILL)
    (summary,) = result
    assert time.monotonic() - killed < 5  # noticed at once (the bell closed), not on a timeout
    assert summary.final_state == "dead"
    assert summary.stop_reason == "control loop ended: control process ended (killed by signal 9)"
    assert not summary.parked
