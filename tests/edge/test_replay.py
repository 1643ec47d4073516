"""Trajectory replay (docs/design/replay.md): loaded once, bridged smoothly, drained locally."""

from __future__ import annotations

from pathlib import Path

import anyio
import numpy as np
import pytest

from servo.edge.config import EdgeConfig, LinkConfig, ReplayConfig
from servo.edge.errors import EdgeStartError
from servo.edge.replay import ReplayEngine, bridge, resample
from servo.edge.runtime import EdgeRuntime, RunOptions, RunSummary
from servo.recording import EpisodeHeader, FrameRecord, RecordingWriter, read_recording
from servo.robots import RobotDescription
from servo.wire import encode_tensor
from tests.support import eventually, make_manifest, running_server

pytestmark = pytest.mark.anyio


def sim() -> RobotDescription:
    return RobotDescription("sim", {"cameras": "none"})


def trajectory(spec_rest: np.ndarray, frames: int = 40) -> np.ndarray:
    t = np.linspace(0.0, 1.0, frames)[:, None]
    offset = np.array([10.0, 8.0, -6.0, -4.0, 0.0, 20.0], dtype=np.float32)  # stays inside the limits
    return (spec_rest + offset * np.sin(np.pi * t)).astype(np.float32)


def write_recording(path: Path, frames: np.ndarray, joint_names: list[str], fps: float = 30.0) -> None:
    writer = RecordingWriter(path, EpisodeHeader(robot="sim", fps=fps, joint_names=joint_names))
    for i, frame in enumerate(frames):
        writer.write(FrameRecord(i, i, encode_tensor(frame), encode_tensor(frame), "policy"))
    writer.close()


def executed(path: Path) -> tuple[np.ndarray, list[str]]:
    recording = read_recording(path)
    rows = [f for f in recording.frames if f.action is not None and f.source == "replay"]
    return np.array([np.frombuffer(f.action.data, "<f4") for f in rows if f.action]), [
        f.source for f in recording.frames
    ]


def test_bridge_is_smooth_and_within_half_the_velocity_limit() -> None:
    spec = sim().spec()
    start = np.asarray(spec.rest_pose, np.float32)
    end = start + np.array([60, -40, 30, 20, 10, 50], np.float32)
    frames = bridge(start, end, spec)
    np.testing.assert_allclose(frames[-1], end, atol=1e-4)
    steps = np.abs(np.diff(np.vstack([start, frames]), axis=0))
    assert (steps <= np.asarray(spec.max_velocity) / spec.fps * 0.5 + 1e-4).all()
    # Minimum-jerk: starts and ends slowly.
    assert steps[0].max() < steps[len(steps) // 2].max() / 5
    assert steps[-1].max() < steps[len(steps) // 2].max() / 5


def test_resample_changes_rate_and_keeps_endpoints() -> None:
    frames = np.stack([np.linspace(0, 10, 11)] * 2, axis=1).astype(np.float32)
    out = resample(frames, 10.0, 30.0)
    assert len(out) == 31
    np.testing.assert_allclose(out[[0, -1]], frames[[0, -1]])
    np.testing.assert_allclose(resample(frames, 30.0, 30.0), frames)


def replay(source: str, *, loop: bool = False, port: int | None = None) -> EdgeConfig:
    """Edge options replaying ``source`` (from the server on ``port`` for ``server:NAME``)."""
    link = LinkConfig() if port is None else LinkConfig(connect=[f"tcp/127.0.0.1:{port}"])
    return EdgeConfig(inference="replay", replay=ReplayConfig(trajectory=source, loop=loop), link=link)


async def run_replay(config: EdgeConfig, tmp_path: Path) -> tuple[RunSummary, ReplayEngine, Path]:
    robot = sim()
    engine = ReplayEngine(config, robot.spec())
    record = tmp_path / "replayed.servo"
    options = RunOptions(duration_s=20.0, record_path=str(record))
    with anyio.fail_after(30):
        summary = await EdgeRuntime(robot, engine, config, options).run()
    return summary, engine, record


async def test_file_replay_drains_every_frame_locally(tmp_path: Path) -> None:
    spec = sim().spec()
    frames = trajectory(np.asarray(spec.rest_pose, np.float32))
    source = tmp_path / "episode.servo"
    write_recording(source, frames, list(spec.joint_names))

    summary, _, record = await run_replay(replay(str(source)), tmp_path)

    assert summary.stop_reason == "finished"
    assert summary.network_requests == 0
    assert summary.parked
    commands, sources = executed(record)
    # The trajectory's frames are executed exactly, after the bridge, in order.
    np.testing.assert_allclose(commands[-len(frames) :], frames, atol=1e-4)
    assert len(commands) >= len(frames)
    assert "replay" in sources


async def test_server_trajectory_is_fetched_in_one_request(tmp_path: Path, port: int) -> None:
    spec = sim().spec()
    frames = trajectory(np.asarray(spec.rest_pose, np.float32), frames=60)
    source = tmp_path / "wave.servo"
    write_recording(source, frames, list(spec.joint_names))
    manifest = make_manifest(port, extra=f'[[trajectories]]\nname = "wave"\npath = "{source}"\n')
    async with running_server(manifest):
        summary, _, record = await run_replay(replay("server:wave", port=port), tmp_path)
    assert summary.network_requests == 1
    commands, _ = executed(record)
    np.testing.assert_allclose(commands[-len(frames) :], frames, atol=1e-4)


async def test_unknown_server_trajectory_is_refused_with_the_list(tmp_path: Path, port: int) -> None:
    async with running_server(make_manifest(port)):
        engine = ReplayEngine(replay("server:nope", port=port), sim().spec())
        with pytest.raises(EdgeStartError, match="no trajectory 'nope'"):
            await engine.arm()


async def test_the_server_reads_its_library_once_at_start_and_answers_from_memory(tmp_path: Path, port: int) -> None:
    spec = sim().spec()
    frames = trajectory(np.asarray(spec.rest_pose, np.float32), frames=30)
    wave, broken = tmp_path / "wave.servo", tmp_path / "broken.servo"
    write_recording(wave, frames, list(spec.joint_names))
    broken.write_bytes(b"not a recording")
    extra = f'[[trajectories]]\nname = "wave"\npath = "{wave}"\n[[trajectories]]\nname = "broken"\npath = "{broken}"\n'
    async with running_server(make_manifest(port, extra=extra)):
        wave.write_bytes(b"replaced after start")  # what the server serves was read before
        fetched = await ReplayEngine(replay("server:wave", port=port), spec).arm()
        with pytest.raises(EdgeStartError, match=r"trajectory 'broken' cannot be read: .*not a servo recording"):
            await ReplayEngine(replay("server:broken", port=port), spec).arm()
    np.testing.assert_allclose(fetched, frames, atol=1e-6)


async def test_loop_starts_over(tmp_path: Path) -> None:
    spec = sim().spec()
    frames = trajectory(np.asarray(spec.rest_pose, np.float32), frames=15)
    source = tmp_path / "short.servo"
    write_recording(source, frames, list(spec.joint_names))
    robot = sim()
    config = replay(str(source), loop=True)
    runtime = EdgeRuntime(robot, engine := ReplayEngine(config, robot.spec()), config, RunOptions(duration_s=20.0))
    async with anyio.create_task_group() as tg:

        async def stop_after_two_laps() -> None:
            await eventually(lambda: engine.laps >= 2, 20, "two laps")
            runtime.request_stop("two laps")

        tg.start_soon(stop_after_two_laps)
        summary = await runtime.run()
    assert engine.laps >= 2
    assert summary.stop_reason == "two laps"


async def test_mismatched_joints_are_refused(tmp_path: Path) -> None:
    source = tmp_path / "other.servo"
    write_recording(source, np.zeros((5, 2), np.float32), ["a.pos", "b.pos"])
    engine = ReplayEngine(replay(str(source)), sim().spec())
    with pytest.raises(EdgeStartError, match="do not match the robot"):
        await engine.arm()


async def test_unreadable_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "junk.servo").write_bytes(b"not a recording")
    engine = ReplayEngine(replay(str(tmp_path / "junk.servo")), sim().spec())
    with pytest.raises(EdgeStartError, match="not a servo recording"):
        await engine.arm()


def six(value: float = 0.0) -> np.ndarray:
    return np.full(6, value, np.float32)


BROKEN = {
    "frames narrower than the header": (
        lambda path, names: write_rows(path, names, [six()[:3]] * 3),
        r"frame 0 \(tick 0\) state has shape \(3,\), the header names 6 joints",
    ),
    "fps of 0": (lambda path, names: write_rows(path, names, [six()] * 3, fps=0.0), r"header.fps = 0.0"),
    "fps NaN": (lambda path, names: write_rows(path, names, [six()] * 3, fps=float("nan")), r"header.fps = nan"),
    "fps inf": (lambda path, names: write_rows(path, names, [six()] * 3, fps=float("inf")), r"header.fps = inf"),
    "a NaN action": (
        lambda path, names: write_rows(path, names, [six(), six(np.nan), six()]),
        r"frame 1 \(tick 1\) state contains NaN",
    ),
    "no joints": (lambda path, names: write_rows(path, [], [six()]), "header.joint_names is empty"),
}


def write_rows(path: Path, names: list[str], rows: list[np.ndarray], fps: float = 30.0) -> None:
    writer = RecordingWriter(path, EpisodeHeader(robot="sim", fps=fps, joint_names=names))
    for i, row in enumerate(rows):
        writer.write(FrameRecord(i, i, encode_tensor(row), encode_tensor(row), "policy"))
    writer.close()


@pytest.mark.parametrize(("write", "problem"), BROKEN.values(), ids=BROKEN.keys())
async def test_a_broken_recording_is_refused_in_one_line_naming_file_and_field(
    tmp_path: Path, write: object, problem: str
) -> None:
    """Issue 8: narrower frames were re-packed onto the wrong joints, a NaN replay stopped the
    loop unparked, fps = 0 gave a traceback. Nothing moves now: one line, file and field."""
    path = tmp_path / "broken.servo"
    write(path, list(sim().spec().joint_names))  # type: ignore[operator]
    engine = ReplayEngine(replay(str(path)), sim().spec())
    with pytest.raises(EdgeStartError, match=problem) as info:
        await engine.arm()
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)
