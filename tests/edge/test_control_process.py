"""The control loop in its own process: actions merged here are executed there, the state and the
camera frames come back, the engine is woken, and the two processes' lifetimes are tied."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import numpy as np
import pytest

from servo.edge.actions import ControlConfig
from servo.edge.channel import LoopState
from servo.edge.errors import EdgeStartError
from servo.edge.observation import ObservationInput
from servo.edge.pipeline import ChunkPipeline, PipelineConfig
from servo.edge.realtime import HELPER_PRIORITY, REALTIME_PRIORITY, thread_table
from servo.robots import RobotDescription
from tests.edge.harness import can_be_realtime, process_loop, stop_beside_a_hog
from tests.support import eventually

pytestmark = pytest.mark.anyio

SIM = RobotDescription("sim", {"cameras": "front:64x48", "fps": "50"})


def pipeline() -> ChunkPipeline:
    config = PipelineConfig(rtc=False, execution_horizon=0, buffer_time_s=0.2)
    return ChunkPipeline(6, 50.0, config, ControlConfig(max_action_age_s=60.0, fallback="hold"))


def merge(pipe: ChunkPipeline, chunk: np.ndarray, seq: int) -> None:
    obs = ObservationInput(np.zeros(6, np.float32), {}, time.monotonic_ns(), 0, pipe.queue.get_position())
    assert pipe.complete(pipe.snapshot(obs), chunk, chunk, time.monotonic_ns(), session_id="ab" * 16, seq_id=seq) == 0


async def test_actions_merged_here_run_there_and_the_state_and_frames_come_back() -> None:
    pipe = pipeline()
    spec = SIM.spec()
    async with process_loop(SIM, pipe) as loop:
        first = loop.latest()
        assert first is not None
        assert set(first.images) == {"front"}
        target = np.asarray(spec.rest_pose, np.float32) + np.array([25, 0, 0, 0, 0, 0], np.float32)
        merge(pipe, np.tile(target, (40, 1)), seq=1)
        await eventually(lambda: loop.statistics().actions_executed >= 40, 10, "the chunk executed")
        await eventually(lambda: pipe.fallback_ticks > 0, 5, "the queue ran dry (counted there, read here)")
        latest = loop.latest()
        assert latest is not None
        assert latest.mono_ns > first.mono_ns
        assert latest.state[0] > first.state[0] + 10  # the arm moved toward the target
        # The sim cameras (in this process) render the pose the control process published.
        assert np.any(latest.images["front"] != first.images["front"])
        stats = loop.statistics()
        assert stats.state is LoopState.RUNNING
        assert stats.realtime == can_be_realtime()
    assert loop.statistics().state is LoopState.STOPPED
    assert pipe.queue.statistics().actions_consumed == 40
    records = loop.drain()
    policy = [r for r in records if r.source == "policy"]
    assert len(policy) == 40
    assert {(r.provenance.session_id, r.provenance.seq_id) for r in policy if r.provenance} == {("ab" * 16, 1)}
    assert [r.tick for r in records] == list(range(len(records)))


async def test_the_engine_is_woken_as_soon_as_the_queue_runs_low() -> None:
    pipe = pipeline()
    async with process_loop(SIM, pipe) as loop:
        merge(pipe, np.tile(np.asarray(SIM.spec().rest_pose, np.float32), (30, 1)), seq=1)
        with anyio.fail_after(20):  # without the bell the wait would run its full 30 s
            await loop.wait(queue_below=10, timeout=30.0)
        assert pipe.queued() < 10


async def test_the_tick_is_real_time_and_every_other_thread_just_below_it() -> None:
    """Where real-time scheduling is permitted; elsewhere every thread stays normal and it ticks anyway."""
    async with process_loop(SIM, pipeline()) as loop:
        assert loop.pid is not None
        pid = loop.pid
        await eventually(lambda: "servo-watchdog" in {t.name for t in thread_table(pid)}, 10, "the watchdog named")
        table = thread_table(pid)
        realtime = can_be_realtime()
        assert loop.statistics().realtime == realtime
        assert table[0].tid == pid  # the main thread ticks
        classes = sorted((t.name, t.policy, t.priority) for t in table)
        if realtime:
            helper = ("rr", HELPER_PRIORITY)
            assert classes == [("servo-tick", "fifo", REALTIME_PRIORITY), ("servo-watchdog", *helper)]
        else:
            assert classes == [("servo-tick", "other", 0), ("servo-watchdog", "other", 0)]


async def test_under_a_cpu_hog_the_loop_stops_at_its_next_tick_by_itself() -> None:
    async with process_loop(SIM, pipeline()) as loop:
        await stop_beside_a_hog(loop)


async def test_a_loop_that_cannot_see_the_stop_is_ended_at_the_deadline() -> None:
    """A driver hung in a blocking read never lets the tick look at the stop request: the edge's
    deadline ends the process anyway (SIGKILL), and says so."""
    stuck = RobotDescription("tests.edge.fakes:stuck", {"cameras": "none"})
    async with process_loop(stuck, pipeline()) as loop:
        assert loop.running  # its first tick is stuck reading the bus
        await loop.stop(timeout=0.5)
        assert not loop.running
    assert loop.statistics().ticks == 0
    assert loop.error == "control process ended (killed by signal 9)"


async def test_a_robot_that_fails_to_connect_there_is_a_start_error_here() -> None:
    pipe = pipeline()
    unplugged = RobotDescription("tests.edge.fakes:unplugged", {"cameras": "none"})
    start_error = pytest.RaisesExc(
        EdgeStartError, match=r"^the control loop did not start: robot: .*could not open port"
    )
    with pytest.RaisesGroup(start_error, flatten_subgroups=True):
        async with process_loop(unplugged, pipe):
            pass  # pragma: no cover


EDGE = """
import sys, anyio
from servo.edge.config import EdgeConfig, ReplayConfig
from servo.edge.replay import ReplayEngine
from servo.edge.runtime import EdgeRuntime, RunOptions
from servo.robots import RobotDescription

robot = RobotDescription("sim", {"cameras": "none"})
config = EdgeConfig(inference="replay", replay=ReplayConfig(trajectory=sys.argv[1], loop=True))
engine = ReplayEngine(config, robot.spec())
runtime = EdgeRuntime(robot, engine, config, RunOptions(park_timeout_s=3.0))

async def main():
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.run)
        while runtime.loop is None or not runtime.loop.running:
            await anyio.sleep(0.01)
        print(runtime.loop.pid, flush=True)

anyio.run(main)
"""


def test_the_control_process_parks_and_exits_when_the_edge_is_killed(tmp_path: Path) -> None:
    from servo.recording import EpisodeHeader, FrameRecord, RecordingWriter
    from servo.wire import encode_tensor

    spec = RobotDescription("sim", {"cameras": "none"}).spec()
    replay = tmp_path / "loop.servo"
    writer = RecordingWriter(replay, EpisodeHeader(robot="sim", fps=30.0, joint_names=list(spec.joint_names)))
    for i in range(30):
        pose = np.asarray(spec.rest_pose, np.float32) + np.float32(i)
        writer.write(FrameRecord(i, i, encode_tensor(pose), encode_tensor(pose), "policy"))
    writer.close()
    edge = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(EDGE), str(replay)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert edge.stdout is not None
        pid = int(edge.stdout.readline())
        control = os.pidfd_open(pid)
        try:
            edge.send_signal(signal.SIGKILL)  # no teardown at all
            edge.wait(10)
            # The watchdog sees stdin close, parks (at most park_timeout_s) and exits.
            readable, _, _ = select.select([control], [], [], 30)
            assert readable, "the control process outlived the edge"
        finally:
            os.close(control)
    finally:
        edge.kill()
        edge.wait(10)
        if edge.stdout is not None:
            edge.stdout.close()
