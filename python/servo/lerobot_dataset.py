"""Recordings become training data: ``.servo`` episodes -> a LeRobotDataset (v3), via LeRobot's writer.

Each recording is one episode. A frame is one control tick: ``observation.state`` is the measured
state, ``action`` the command sent to the robot (after the safety layer; a tick that held repeats
the previous command), ``observation.images.<camera>`` the camera frame (recordings keep a frame
every N ticks: in between, the newest one is repeated) and ``task`` the task the policy ran with
(the server's effective task, recorded by the edge). Ticks before the first command and the park
at teardown are not part of the episode: they are not what the robot was asked to do.

LeRobot (>= 0.5, Python >= 3.12, ``pip install 'servo-robotics[lerobot]'``) is imported when exporting.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from servo.errors import ServoError
from servo.logs import get_logger
from servo.recording import EpisodeHeader, FrameRecord, Recording, read_recording
from servo.wire import WireError, decode_image, decode_tensor

log = get_logger(__name__)


class ExportError(ServoError, ValueError):
    """The recordings cannot become a dataset; the message names the file and what is wrong."""


@dataclass(frozen=True)
class ExportSummary:
    """What was written."""

    root: Path
    repo_id: str
    episodes: int
    frames: int
    tasks: list[str]
    cameras: list[str]


def export_recordings(
    recordings: Sequence[str | Path],
    *,
    root: str | Path,
    repo_id: str,
    task: str = "",
    use_videos: bool = True,
) -> ExportSummary:
    """Write ``recordings`` (one episode each) as a new LeRobotDataset at ``root``.

    Args:
        recordings: ``.servo`` files of the same robot (joints, fps, cameras).
        root: Dataset directory to create (must not exist).
        repo_id: Dataset id stored in its metadata, e.g. ``local/so100_sweep``.
        task: Overrides the task recorded in every file.
        use_videos: Store cameras as MP4 videos (LeRobot's default) rather than PNG frames.

    Raises:
        ExportError: unreadable or inconsistent recordings, no task, an existing ``root``, or
            LeRobot missing.
    """
    if not recordings:
        raise ExportError("no recordings to export")
    episodes = [_read(path) for path in recordings]
    first_path, first = episodes[0]
    for path, rec in episodes[1:]:
        _check_same_robot(first_path, first.header, path, rec.header)
    fps = round(first.header.fps)
    if abs(first.header.fps - fps) > 1e-6:
        raise ExportError(f"{first_path}: LeRobot datasets need an integer fps; the recording has {first.header.fps}")
    cameras = _recorded_cameras(episodes)
    if Path(root).exists():
        raise ExportError(f"dataset root {str(root)!r} already exists; choose a new directory")
    LeRobotDataset = _lerobot_dataset()
    dataset = LeRobotDataset.create(
        repo_id=repo_id,
        fps=fps,
        features=_features(first.header, cameras, use_videos=use_videos),
        root=root,
        robot_type=first.header.robot,
        use_videos=use_videos,
        video_backend="pyav",  # decoding only (never done here): skips torchcodec's probe
    )
    frames, tasks = 0, []
    try:
        for path, rec in episodes:
            episode_task = task or rec.header.task
            if not episode_task:
                raise ExportError(f"{path}: the recording has no task; give one with --task")
            count = 0
            for frame in _frames(rec, cameras):
                dataset.add_frame({**frame, "task": episode_task})
                count += 1
            if count == 0:
                raise ExportError(f"{path}: no tick carries a command; nothing to export")
            dataset.save_episode()
            log.info("episode exported", recording=str(path), frames=count, task=episode_task)
            frames += count
            tasks.append(episode_task)
    finally:
        dataset.finalize()
    return ExportSummary(Path(dataset.root), repo_id, len(episodes), frames, tasks, cameras)


def _lerobot_dataset() -> Any:
    try:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
    except ImportError as exc:
        raise ExportError(
            f"exporting needs LeRobot >= 0.5 on Python >= 3.12: pip install 'servo-robotics[lerobot]' ({exc})"
        ) from exc
    return LeRobotDataset


def _read(path: str | Path) -> tuple[Path, Recording]:
    try:
        return Path(path), read_recording(path)
    except (OSError, WireError) as exc:
        raise ExportError(f"{path}: {exc}") from None


def _check_same_robot(path_a: Path, a: EpisodeHeader, path_b: Path, b: EpisodeHeader) -> None:
    for what, mine, theirs in (
        ("joints", a.joint_names, b.joint_names),
        ("fps", a.fps, b.fps),
        ("cameras", a.cameras, b.cameras),
    ):
        if mine != theirs:
            raise ExportError(f"{path_b}: {what} {theirs} differ from {path_a}'s {mine}; export them separately")


def _recorded_cameras(episodes: list[tuple[Path, Recording]]) -> list[str]:
    """Cameras with frames in every recording (the others are left out, with a warning)."""
    declared = list(episodes[0][1].header.cameras)
    kept = [name for name in declared if all(any(name in f.images for f in rec.frames) for _, rec in episodes)]
    if dropped := [name for name in declared if name not in kept]:
        log.warning(
            "cameras without recorded frames are left out (record with --record-images-every N)",
            cameras=dropped,
        )
    return kept


def _features(header: EpisodeHeader, cameras: list[str], *, use_videos: bool) -> dict[str, dict[str, Any]]:
    joints = list(header.joint_names)
    vector = {"dtype": "float32", "shape": (len(joints),), "names": joints}
    features: dict[str, dict[str, Any]] = {"observation.state": dict(vector), "action": dict(vector)}
    for name in cameras:
        height, width = header.cameras[name]
        features[f"observation.images.{name}"] = {
            "dtype": "video" if use_videos else "image",
            "shape": (height, width, 3),
            "names": ["height", "width", "channels"],
        }
    return features


def _frames(rec: Recording, cameras: list[str]) -> Iterator[dict[str, npt.NDArray[Any]]]:
    """Dataset frames of one recording: from the first command to the park, images held."""
    dim = len(rec.header.joint_names)
    action: npt.NDArray[np.float32] | None = None
    images: dict[str, npt.NDArray[np.uint8]] = {}
    for record in rec.frames:
        if record.source == "park":
            return
        images.update(_images(record, cameras))
        if record.action is not None:
            action = np.array(decode_tensor(record.action, dtype="float32", shape=(dim,)), dtype=np.float32)
        if action is None or len(images) < len(cameras):
            continue
        state = np.array(decode_tensor(record.state, dtype="float32", shape=(dim,)), dtype=np.float32)
        frame: dict[str, npt.NDArray[Any]] = {"observation.state": state, "action": action}
        frame.update({f"observation.images.{name}": images[name] for name in cameras})
        yield frame


def _images(record: FrameRecord, cameras: list[str]) -> dict[str, npt.NDArray[np.uint8]]:
    return {
        name: np.asarray(decode_image(record.images[name], what=f"tick {record.tick} camera {name!r}"))
        for name in cameras
        if name in record.images
    }
