"""Local engines (sync, rtc) and the weightless remote edge."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from servo.edge.config import EdgeConfig
from servo.edge.errors import EdgeStartError
from servo.edge.exactness import check_steps
from servo.edge.local import RtcEngine, SyncEngine
from servo.edge.runtime import EdgeRuntime, RunOptions
from servo.policy.reference import ReferencePolicy
from servo.recording import read_recording
from servo.robots import RobotDescription
from tests.support import make_manifest, running_server

pytestmark = pytest.mark.anyio

CAM = (48, 64)


def sim() -> RobotDescription:
    return RobotDescription("sim", {"cameras": f"front:{CAM[1]}x{CAM[0]}"})


def every_step_once(recording: Path, chunks: int) -> None:
    """The recording shows each step run once, over at least ``chunks`` chunks."""
    report = check_steps(read_recording(recording).frames)
    assert report.exact, report.summary()
    assert report.chunks - report.unverified >= chunks, report.summary()


async def test_rtc_engine_streams_in_the_background(tmp_path: Path) -> None:
    robot = sim()
    engine = RtcEngine(EdgeConfig(), robot.spec(), policy=ReferencePolicy(cameras={"front": CAM}, compute_ms=40))
    options = RunOptions(duration_s=2.5, record_path=str(tmp_path / "rtc.servo"))
    summary = await EdgeRuntime(robot, engine, EdgeConfig(), options).run()
    assert summary.final_state == "streaming"
    assert summary.chunks_received >= 2
    every_step_once(tmp_path / "rtc.servo", 2)
    # Inference runs off the control loop: the loop keeps its schedule.
    assert summary.ticks >= 0.8 * 2.5 * robot.spec().fps
    assert summary.missed_deadlines <= 3


async def test_sync_engine_blocks_the_loop_during_inference(tmp_path: Path) -> None:
    robot = sim()
    engine = SyncEngine(EdgeConfig(), robot.spec(), policy=ReferencePolicy(cameras={"front": CAM}, compute_ms=150))
    options = RunOptions(duration_s=2.5, record_path=str(tmp_path / "sync.servo"))
    summary = await EdgeRuntime(robot, engine, EdgeConfig(), options).run()
    assert summary.chunks_received >= 2
    every_step_once(tmp_path / "sync.servo", 2)
    assert not engine.pipeline.rtc, "sequential mode appends"
    assert summary.control_loop == "ThreadControlLoop"  # its policy runs inside the tick
    # Each inference holds the loop for ~150 ms = ~4-5 ticks at 30 Hz: counted as missed.
    assert summary.missed_deadlines >= 3 * summary.chunks_received


async def test_local_policy_that_does_not_fit_the_robot_is_refused() -> None:
    robot = sim()
    policy = ReferencePolicy(cameras={"top": CAM})
    engine = RtcEngine(EdgeConfig(), robot.spec(), policy=policy)
    with pytest.raises(EdgeStartError, match="camera"):
        await anyio.to_thread.run_sync(engine.load)


async def test_remote_edge_never_imports_torch(port: int) -> None:
    # The server (this process) has torch; the edge runs in a fresh interpreter and must not.
    script = f"""
import sys, anyio
from servo.edge.config import load_edge_config
from servo.edge.engines import make_engine
from servo.edge.runtime import EdgeRuntime, RunOptions
from servo.robots import RobotDescription
import servo.cli.edge, servo.client, servo.edge.replay
robot = RobotDescription("sim", {{"cameras": "front:64x48"}})
config = load_edge_config(flags={{"connect": ["tcp/127.0.0.1:{port}"]}})
summary = anyio.run(EdgeRuntime(robot, make_engine(config, robot.spec()), config, RunOptions(duration_s=1.5)).run)
assert summary.chunks_received >= 1, summary
print("torch" in sys.modules)
"""
    async with running_server(make_manifest(port)):
        done = await anyio.run_process([sys.executable, "-c", script], check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().strip().splitlines()[-1] == "False"


def test_local_engines_import_torch_only_when_chosen() -> None:
    code = "import sys, servo.edge.engines, servo.edge.local; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"
