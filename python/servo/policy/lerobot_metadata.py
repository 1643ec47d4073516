"""What a LeRobot checkpoint folder says about the robot it drives, and where each fact came from.

LeRobot spreads it over several files, all read here as plain JSON (LeRobot is not imported):

- ``config.json``: the policy type and the feature shapes (``observation.state``, ``action``,
  ``observation.images.<cam>``); Pi0.5/Pi0-FAST also keep ``action_feature_names``.
- ``train_config.json`` (written by ``lerobot-train``): the training dataset (``repo_id``,
  ``root``) and, for a simulated environment, its ``fps``.
- the training dataset's ``meta/info.json``: the rate (``fps``), the joint names
  (``features.action.names``, ``features["observation.state"].names``) and ``robot_type``. It is
  read when that dataset is on this machine (``dataset.root``, else LeRobot's cache
  ``$HF_LEROBOT_HOME/<repo_id>`` or its hub snapshots), never downloaded.
- ``policy_preprocessor.json``: the rename map of observation keys (a robot camera ``laptop``
  feeding the checkpoint's ``camera1``) and the normaliser's ``.safetensors`` statistics.

Units are recorded nowhere. LeRobot's -100..100 mode clips every arm joint to its calibrated range,
so a joint whose statistics go past ±100 proves degrees; anything else proves nothing and is said
so. A value the options give always wins; a value found nowhere is defaulted, and `CheckpointFacts`
says which.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from servo.config import ConfigError
from servo.logs import get_logger
from servo.policy.lerobot_checkpoint import ACTION_KEY, IMAGE_PREFIX, LEROBOT_ARM_JOINTS, STATE_KEY, LeRobotOptions
from servo.robots.calibration import lerobot_home

log = get_logger(__name__)

#: The rate assumed when neither the options, the dataset nor the environment give one.
DEFAULT_FPS = 30.0
#: Largest JSON header a statistics ``.safetensors`` may have (a few kB in practice).
_MAX_HEADER_BYTES = 1 << 20
#: Past this, a LeRobot -100..100 arm joint cannot be (a little slack for float rounding).
_RANGE_LIMIT = 100.5
#: The preprocessor step that renames observation keys.
_RENAME = "rename_observations_processor"
#: LeRobot robot types -> servo's ``--robot`` for the arms servo drives.
ROBOTS = {"so100_follower": "so100", "so101_follower": "so101", "so_follower": "so101"}


@dataclass(frozen=True)
class CheckpointFacts:
    """What a checkpoint is served with: values and, per fact, where it came from. Immutable.

    ``units`` is ``""`` when undeclared (the robot's units are then not checked).
    """

    policy_type: str
    fps: float
    action_names: list[str]
    state_names: list[str]
    units: str | list[str]
    robot_type: str
    #: Robot camera name -> checkpoint camera name, where they differ.
    camera_renames: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def robot(self) -> str | None:
        """The ``servo-edge --robot`` for the dataset's robot type (None when servo has no such arm)."""
        return ROBOTS.get(self.robot_type)

    def describe(self) -> str:
        """One line: each fact with where it came from, defaults named as such."""
        units = self.units if isinstance(self.units, str) else ", ".join(self.units)
        fps, names = self.sources["fps"], self.sources["names"]
        rate = (
            f"fps {self.fps:g} and names from {fps}"
            if fps == names
            else f"fps {self.fps:g} from {fps}; names from {names}"
        )
        told = (
            f"units {units} from {self.sources['units']}" if units else f"units not declared: {self.sources['units']}"
        )
        return (
            f"checkpoint ({self.policy_type}): {rate}; {told}; "
            f"state/action sizes and cameras from config.json{self.sources.get('cameras', '')}"
        )


def read_facts(checkpoint: Path, options: LeRobotOptions) -> CheckpointFacts:
    """Read a checkpoint's facts, the options first (see the module docstring).

    A malformed side file (train config, dataset info, statistics) is logged and skipped.

    Raises:
        ConfigError: names whose count does not match the checkpoint's (the option named).
    """
    config = _json(checkpoint / "config.json") or {}
    policy_type = str(config.get("type", "?"))
    train = _json(checkpoint / "train_config.json") or {}
    dataset, info = _dataset_info(train)
    sources: dict[str, str] = {}

    fps, sources["fps"] = _fps(options, info, dataset, train)
    action_dim, state_dim = _dim(config, "output_features", ACTION_KEY), _dim(config, "input_features", STATE_KEY)
    action_names, sources["names"] = _action_names(options, info, dataset, config, action_dim, policy_type)
    state_names = list(options.state_names) or _names(info, STATE_KEY)
    if not options.state_names and len(state_names) != state_dim:
        state_names = action_names if state_dim == len(action_names) else []
    if state_dim is not None and len(state_names) != state_dim:
        raise ConfigError(
            f"state_names: the LeRobot {policy_type} checkpoint has a {state_dim}-value state; name all "
            f"{state_dim} in order (got {len(state_names)})"
        )
    units, sources["units"] = _units(options, checkpoint, action_names)
    renames = dict(options.cameras) or _camera_renames(checkpoint)
    if renames:
        shown = ", ".join(f"{robot} -> {ours}" for robot, ours in sorted(renames.items()))
        origin = "the options" if options.cameras else "its rename_map"
        sources["cameras"] = f" (robot -> checkpoint camera: {shown}, from {origin})"
    return CheckpointFacts(
        policy_type=policy_type,
        fps=fps,
        action_names=action_names,
        state_names=state_names,
        units=units,
        robot_type=str((info or {}).get("robot_type") or ""),
        camera_renames=renames,
        sources=sources,
    )


def _fps(
    options: LeRobotOptions, info: dict[str, Any] | None, dataset: str, train: dict[str, Any]
) -> tuple[float, str]:
    if options.fps is not None:
        return options.fps, "the options"
    if info is not None and _positive(info.get("fps")):
        return float(info["fps"]), f"dataset {dataset}"
    env = train.get("env")
    if isinstance(env, dict) and _positive(env.get("fps")):
        return float(env["fps"]), f"train_config.json env {env.get('type', '')}".rstrip()
    where = f"dataset {dataset} not on this machine" if dataset else "no training dataset named"
    return DEFAULT_FPS, f"the default ({where}; set fps)"


def _action_names(
    options: LeRobotOptions,
    info: dict[str, Any] | None,
    dataset: str,
    config: dict[str, Any],
    dim: int | None,
    policy_type: str,
) -> tuple[list[str], str]:
    if options.action_names:
        if dim is not None and len(options.action_names) != dim:
            raise ConfigError(
                f"action_names: the LeRobot {policy_type} checkpoint has {dim} action values; name all {dim} in "
                f"order (got {len(options.action_names)})"
            )
        return list(options.action_names), "the options"
    from_config = _strings(config.get("action_feature_names"))
    for names, source in ((_names(info, ACTION_KEY), f"dataset {dataset}"), (from_config, "config.json")):
        if names and (dim is None or len(names) == dim):
            return names, source
        if names:
            log.warning("checkpoint names do not fit its actions: ignored", source=source, names=len(names), dim=dim)
    if dim == len(LEROBOT_ARM_JOINTS):
        return list(LEROBOT_ARM_JOINTS), "the default (LeRobot's six-motor arm order)"
    if dim is None:
        return [], "nowhere (the checkpoint has no action output)"
    raise ConfigError(
        f"action_names: the LeRobot {policy_type} checkpoint does not name its {dim} action values and its training "
        f"dataset is not at hand ({dataset or 'no train_config.json'}); name them in order: servo-serve --lerobot "
        "PATH --action-names NAME,NAME,… (a manifest: model.options.action_names)"
    )


def _units(options: LeRobotOptions, checkpoint: Path, names: list[str]) -> tuple[str | list[str], str]:
    if options.units:
        return options.units, "the options"
    arm = [i for i, name in enumerate(names) if name.endswith(".pos") and not name.startswith("gripper")]
    reach = _stats_reach(checkpoint, [ACTION_KEY, STATE_KEY], arm) if arm else None
    if reach is not None and reach > _RANGE_LIMIT:
        return "degrees", f"the normalisation stats (an arm joint reaches {reach:.0f}, past -100..100)"
    return "", "LeRobot does not record them (--units or option units: degrees or range_m100_100)"


def _camera_renames(checkpoint: Path) -> dict[str, str]:
    """Robot camera -> checkpoint camera from the preprocessor's rename step (LeRobot's ``rename_map``)."""
    renames: dict[str, str] = {}
    for step in _steps(checkpoint):
        config = step.get("config") if step.get("registry_name") == _RENAME else None
        rename_map = config.get("rename_map") if isinstance(config, dict) else None
        for source, target in rename_map.items() if isinstance(rename_map, dict) else ():
            if all(isinstance(key, str) and key.startswith(IMAGE_PREFIX) for key in (source, target)):
                renames[source.removeprefix(IMAGE_PREFIX)] = target.removeprefix(IMAGE_PREFIX)
    return renames


def _steps(checkpoint: Path) -> list[dict[str, Any]]:
    pipeline = _json(checkpoint / "policy_preprocessor.json") or {}
    steps = pipeline.get("steps")
    return [s for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []


def _stats_reach(checkpoint: Path, keys: list[str], columns: list[int]) -> float | None:
    """The largest magnitude the normaliser's min/max statistics give ``columns`` of ``keys``."""
    files = [s["state_file"] for s in _steps(checkpoint) if isinstance(s.get("state_file"), str)]
    reach: float | None = None
    for name in files:
        path = checkpoint / Path(name).name  # a file of the checkpoint, never elsewhere
        tensors = _safetensors(path, {f"{key}.{stat}" for key in keys for stat in ("min", "max")})
        for values in tensors.values():
            if values.ndim == 1 and values.size > max(columns):
                peak = float(np.max(np.abs(values[columns])))
                reach = peak if reach is None else max(reach, peak)
    return reach


def _safetensors(path: Path, wanted: set[str]) -> dict[str, np.ndarray[Any, Any]]:
    """The float32 tensors named ``wanted`` in a ``.safetensors`` file ({} when unreadable)."""
    try:
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > _MAX_HEADER_BYTES:
                raise ValueError(f"header of {size} bytes")
            header = json.loads(f.read(size))
            out = {}
            for name in wanted & set(header):
                entry = header[name]
                start, end = entry["data_offsets"]
                if entry["dtype"] != "F32" or not 0 <= start <= end or end - start > _MAX_HEADER_BYTES:
                    continue
                f.seek(8 + size + start)
                data = f.read(end - start)
                out[name] = np.frombuffer(data, dtype="<f4").reshape(entry["shape"])
            return out
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        log.warning("normalisation statistics unreadable", file=str(path), error=str(exc))
        return {}


def _dataset_info(train: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """The training dataset's id and its ``meta/info.json`` when it is on this machine."""
    dataset = train.get("dataset")
    if not isinstance(dataset, dict) or not isinstance(dataset.get("repo_id"), str):
        return "", None
    repo_id: str = dataset["repo_id"]
    root = dataset.get("root")
    home = lerobot_home()
    candidates = [Path(root).expanduser()] if isinstance(root, str) and root else []
    candidates.append(home / repo_id)
    snapshots = home / "hub" / f"datasets--{repo_id.replace('/', '--')}" / "snapshots"
    if snapshots.is_dir():
        candidates += sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    for directory in candidates:
        info = _json(directory / "meta" / "info.json")
        if info is not None:
            return f"{repo_id} ({directory / 'meta' / 'info.json'})", info
    return repo_id, None


def _names(info: dict[str, Any] | None, key: str) -> list[str]:
    """The names a dataset's ``meta/info.json`` gives feature ``key``."""
    features = (info or {}).get("features")
    feature = features.get(key) if isinstance(features, dict) else None
    names = feature.get("names") if isinstance(feature, dict) else None
    if isinstance(names, dict):  # older datasets: {"motors": [...]}
        names = next(iter(names.values()), None) if len(names) == 1 else None
    return _strings(names)


def _strings(value: Any) -> list[str]:
    return list(value) if isinstance(value, list) and all(isinstance(v, str) for v in value) else []


def _dim(config: dict[str, Any], section: str, key: str) -> int | None:
    features = config.get(section)
    feature = features.get(key) if isinstance(features, dict) else None
    shape = feature.get("shape") if isinstance(feature, dict) else None
    return int(shape[0]) if isinstance(shape, list) and len(shape) == 1 and isinstance(shape[0], int) else None


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``; None when absent or malformed (logged: a side file never stops serving)."""
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("checkpoint file unreadable", file=str(path), error=str(exc))
        return None
    return value if isinstance(value, dict) else None
