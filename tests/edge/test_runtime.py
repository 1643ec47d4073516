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

from servo.edge.channel import LoopState
from servo.edge.config import EdgeConfig
from servo.edge.control_process import ProcessControlLoop
from servo.edge.engine import LOCAL_SESSION, EngineBase
from servo.edge.pipeline import PipelineConfig, Produced, Request
from servo.edge.runtime import EdgeRuntime, RunOptions
from servo.recording import read_recording
from servo.robots import RobotDescription
from servo.wire import decode_tensor
from tests.edge.fakes import EchoEngine
from tests.support import eventually

pytestmark = pytest.mark.anyio

AWAY = [10.0, -80.0, 80.0, 50.0, 5.0, 30.0]


def sim(**options: object) -> RobotDescription:
    return RobotDescription("sim", {"cameras": "none", "initial_pose": AWAY, **options})


class CrashingEngine(EngineBase):
    """Starts fine, then its `produce` raises (an engine bug) once the control loop has published
    a few observations."""

    def __init__(self, config: EdgeConfig, robot: RobotDescription, *, crash_after: int) -> None:
        super().__init__(config, robot.spec())
        self._crash_after = crash_after
        self._seen: set[int] = set()

    async def produce(self, request: Request, *, episode_start: bool) -> Produced | None:
        self._seen.add(request.obs.mono_ns)
        if len(self._seen) >= self._crash_after:
            raise RuntimeError("engine bug")
        await anyio.sleep(0.005)
        return None  # nothing for this request: the loop asks again


class ChunkEngine(EngineBase):
    """Answers its first requests with the given chunks, then never again."""

    def __init__(self, config: EdgeConfig, robot: RobotDescription, chunks: list[np.ndarray]) -> None:
        super().__init__(config, robot.spec())
        self.chunks = iter(chunks)

    async def produce(self, request: Request, *, episode_start: bool) -> Produced:
        chunk = next(self.chunks, None)
        if chunk is None:
            await anyio.sleep_forever()
        assert chunk is not None
        self.requests += 1
        return Produced(chunk, chunk, LOCAL_SESSION, self.requests, 0.0)


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
    class FailsAtStart(EchoEngine):
        async def start(self) -> None:
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
