"""Recordings become a LeRobotDataset (v3) that LeRobot itself loads: task, frames, features."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lerobot", minversion="0.5", reason="needs servo-robotics[lerobot] (Python >= 3.12)")

from servo._core import Provenance
from servo.cli.dataset import main as dataset_main
from servo.edge.recorder import Recorder, Tick
from servo.edge.remote import RemoteEngine
from servo.edge.runtime import RunOptions
from servo.lerobot_dataset import ExportError, export_recordings
from servo.recording import read_recording
from servo.robots.sim import SimCameraConfig, SimConfig, SimSO100
from tests.edge.harness import edge_config, running_edge, small_sim
from tests.support import eventually, make_manifest, running_server

JOINTS = 6
#: The in-process test server's camera (tests.support.make_manifest), as small_sim() has it.
SMALL_CAMERA = SimCameraConfig("front", 48, 64)
H, W = SMALL_CAMERA.height, SMALL_CAMERA.width


def load(root: Path, repo_id: str = "local/servo_test"):  # type: ignore[no-untyped-def]
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(repo_id, root=root, video_backend="pyav")


def synthetic_episode(path: Path, *, task: str = "fold the towel") -> list[Tick]:
    """Ticks a control loop could produce: a hold before the first command, frames every 2 ticks, a park."""
    spec = SimSO100(SimConfig(cameras=(SMALL_CAMERA,))).spec
    ticks = []
    for i in range(12):
        frame = np.full((H, W, 3), 20 * i, np.uint8)
        state = np.full(JOINTS, i, np.float32)
        action = None if i in (0, 5) else np.full(JOINTS, 100 + i, np.float32)
        source = "none" if action is None else ("park" if i >= 10 else "policy")
        provenance = Provenance("01" * 16, i, 0, i) if source == "policy" else None
        ticks.append(Tick(i, i * 33_000_000, state, action, source, provenance, {"front": frame}))
    recorder = Recorder(path, spec, task=task, image_every=2)
    recorder.start()
    for tick in ticks:
        recorder.record(tick)
    recorder.close()
    return ticks


def test_exported_frames_are_what_the_robot_did(tmp_path: Path) -> None:
    synthetic_episode(tmp_path / "ep.servo")
    episode, root = tmp_path / "ep.servo", tmp_path / "ds"
    summary = export_recordings([episode], root=root, repo_id="local/servo_test", use_videos=False)
    # Tick 0 has no command yet; ticks 10-11 park the arm: ticks 1..9 are the episode.
    assert (summary.episodes, summary.frames, summary.tasks, summary.cameras) == (1, 9, ["fold the towel"], ["front"])
    ds = load(root)
    assert len(ds) == 9
    assert ds.meta.total_episodes == 1
    assert ds.fps == 30
    assert ds.meta.robot_type == "sim"
    assert ds.features["action"]["names"] == list(SimSO100().spec.joint_names)
    assert ds.features["observation.images.front"]["shape"] == (H, W, 3)
    for index in range(9):
        item = ds[index]
        tick = index + 1
        assert item["task"] == "fold the towel"
        np.testing.assert_array_equal(item["observation.state"].numpy(), np.full(JOINTS, tick, np.float32))
        held = 104 if tick == 5 else 100 + tick  # tick 5 held: its command is tick 4's
        np.testing.assert_array_equal(item["action"].numpy(), np.full(JOINTS, held, np.float32))
        image = item["observation.images.front"].numpy()  # (3, H, W) floats in [0, 1]
        recorded = 20 * (tick - tick % 2)  # frames every 2 ticks: the newest one is repeated
        assert image.shape == (3, H, W)
        assert abs(float(image.mean()) * 255 - recorded) < 2  # JPEG in the recording


@pytest.mark.anyio
async def test_a_served_run_exports_with_the_servers_task_and_loads_as_video(port: int, tmp_path: Path) -> None:
    record = tmp_path / "run.servo"
    options, serving = "cameras = {front = [48, 64]}\nchunk_size = 20", '[serving]\ndefault_task = "sweep the table"'
    manifest = make_manifest(port, options=options, extra=serving)
    async with running_server(manifest):
        sim = small_sim()
        engine = RemoteEngine(edge_config(port), sim.spec())
        options = RunOptions(record_path=str(record), record_images_every=1)
        async with running_edge(sim, engine, options) as run:
            await eventually(lambda: engine.chunks_received >= 2 and run.runtime.loop is not None, 20, "two chunks")
            loop = run.runtime.loop
            await eventually(lambda: loop.statistics().ticks >= 40, 20, "40 ticks")
            await run.stop()
    rec = read_recording(record)
    assert rec.header.task == "sweep the table"  # the edge named no task: the server's default
    summary = export_recordings([record, record], root=tmp_path / "ds", repo_id="local/servo_test")
    ds = load(tmp_path / "ds")
    first_command = next(i for i, f in enumerate(rec.frames) if f.action is not None)
    park = next((i for i, f in enumerate(rec.frames) if f.source == "park"), len(rec.frames))
    assert summary.frames == len(ds) == 2 * (park - first_command)
    assert ds.meta.total_episodes == 2
    assert list(ds.meta.tasks.index) == ["sweep the table"]
    assert ds.meta.video_keys == ["observation.images.front"]
    assert {"observation.state", "action", "observation.images.front"} <= set(ds.features)
    item = ds[0]
    assert item["task"] == "sweep the table"
    assert item["observation.images.front"].shape == (3, H, W)
    np.testing.assert_allclose(item["action"].numpy(), rec.actions()[0])


@pytest.fixture
def cli_logging() -> Iterator[None]:
    """The command points the root logger at this test's captured stderr: put it back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


@pytest.mark.usefixtures("cli_logging")
def test_servo_dataset_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.servo", tmp_path / "b.servo"
    synthetic_episode(a)
    synthetic_episode(b, task="")

    def export(*recordings: Path, root: str, extra: tuple[str, ...] = ()) -> int:
        argv = ["export", *map(str, recordings), "--root", str(tmp_path / root), "--repo-id", "local/servo_test"]
        return dataset_main([*argv, *extra])

    assert export(a, b, root="ds") == 2
    assert "b.servo: the recording has no task; give one with --task" in capsys.readouterr().err
    assert export(a, root="ds", extra=("--images",)) == 2  # the failed attempt left the directory behind
    assert "already exists" in capsys.readouterr().err
    assert export(a, b, root="ds2", extra=("--task", "fold", "--images")) == 0
    assert "wrote 2 episode(s), 18 frames" in capsys.readouterr().err
    assert len(load(tmp_path / "ds2")) == 18


def test_inconsistent_recordings_are_refused(tmp_path: Path) -> None:
    synthetic_episode(tmp_path / "a.servo")
    other = SimSO100(SimConfig(cameras=(), fps=15)).spec
    recorder = Recorder(tmp_path / "b.servo", other, task="x")
    recorder.start()
    recorder.close()
    with pytest.raises(ExportError, match=r"b\.servo: fps 15\.0 differ"):
        export_recordings([tmp_path / "a.servo", tmp_path / "b.servo"], root=tmp_path / "ds", repo_id="local/x")
    assert not (tmp_path / "ds").exists()
