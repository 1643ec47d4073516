"""What a LeRobot checkpoint says about itself, and what a user adds: ``model.options`` of ``source = "lerobot"``.

LeRobot keeps joint names in its datasets and units nowhere, so the spec servo advertises for a
checkpoint is its features (state and action sizes, ``observation.images.<cam>`` cameras) plus the
options below. LeRobot is not imported here (the hub client is, lazily, to find a cached hub id).
An option that cannot be used raises `ConfigError` from the option's name on; the loader puts the
options' own key (``model.options``, or the edge's ``policy_options``) in front.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Any

import msgspec

from servo.config import ConfigError, NonEmptyStr, PositiveFloat, PositiveInt, doc

STATE_KEY = "observation.state"
ACTION_KEY = "action"
IMAGE_PREFIX = "observation.images."

#: LeRobot's six-motor arms (SO-100/101, Koch) in their feature order; assumed for a 6-dim
#: checkpoint that does not name its actions (LeRobot keeps names in the dataset, not the policy).
LEROBOT_ARM_JOINTS = (
    "shoulder_pan.pos",
    "shoulder_lift.pos",
    "elbow_flex.pos",
    "wrist_flex.pos",
    "wrist_roll.pos",
    "gripper.pos",
)
#: LeRobot's arm followers always normalise the gripper to 0..100, whatever ``use_degrees`` says.
_GRIPPER_UNIT = "range_0_100"


class LeRobotOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[model.options]`` of ``source = "lerobot"``."""

    path: Annotated[NonEmptyStr, doc("checkpoint directory (save_pretrained) or a hub id already in the local cache")]
    revision: Annotated[str, doc("revision of a cached hub id (default: the cached main)")] = ""
    name: Annotated[str, doc("model name to advertise (default: hub id or lerobot/<type>)")] = ""
    action_names: Annotated[
        list[str], doc("action names in checkpoint order, if the checkpoint does not carry them")
    ] = []
    state_names: Annotated[list[str], doc("state names in checkpoint order (default: the action names)")] = []
    units: Annotated[
        str | list[str],
        doc(
            "units the checkpoint was trained in: one per action, or one name for the arm "
            "joints (degrees = LeRobot use_degrees=true, range_m100_100 = use_degrees=false; "
            "grippers are range_0_100)"
        ),
    ] = ""
    cameras: Annotated[
        dict[str, str], doc("robot camera name -> checkpoint camera (observation.images.<name>) when they differ")
    ] = {}
    fps: Annotated[
        PositiveFloat | None, doc("control rate the checkpoint was trained at (default: its dataset's, else 30)")
    ] = None
    rtc: Annotated[bool, doc("real-time chunking where the policy implements it")] = True
    execution_horizon: Annotated[PositiveInt, doc("RTC: prefix steps the guidance pulls the new chunk towards")] = 10
    max_guidance_weight: Annotated[PositiveFloat, doc("RTC: cap of the guidance weight")] = 10.0


def resolve_checkpoint(path: str, revision: str) -> tuple[Path, str]:
    """The checkpoint directory, and the hub id when ``path`` named one (from the local cache only)."""
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ConfigError(f"path: {path!r} has no config.json; point it at a directory written by save_pretrained")
        return local, ""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id=path, revision=revision or None, local_files_only=True)), path
    except (LocalEntryNotFoundError, HFValidationError):
        raise ConfigError(
            f"path: {path!r} is neither a checkpoint directory nor a hub id in the local cache "
            f"(servo never downloads: run `hf download {path}` first)"
        ) from None


def camera_keys(config: Any, renames: dict[str, str]) -> dict[str, str]:
    """Robot camera name -> checkpoint image key (``observation.images.<cam>`` -> ``<cam>``)."""
    by_checkpoint_name = {key.removeprefix(IMAGE_PREFIX): key for key in config.image_features}
    unknown = sorted(set(renames.values()) - set(by_checkpoint_name))
    if unknown:
        raise ConfigError(f"cameras: the checkpoint has no camera(s) {unknown}; it has {sorted(by_checkpoint_name)}")
    robot_name = {checkpoint: robot for robot, checkpoint in renames.items()}
    return {robot_name.get(name, name): key for name, key in by_checkpoint_name.items()}


def declared_units(units: str | list[str], names: list[str]) -> list[str]:
    """The ``units`` option as one unit per value (grippers: ``range_0_100``); [] when undeclared."""
    if isinstance(units, list):
        if len(units) != len(names):
            raise ConfigError(f"units: {len(units)} units for {len(names)} values ({', '.join(names)})")
        return list(units)
    if not units:
        return []
    return [_GRIPPER_UNIT if name.startswith("gripper") else units for name in names]


def fingerprint(checkpoint: Path, policy_type: str) -> str:
    """A revision for a checkpoint: changes when its config or weights file is rewritten."""
    digest = hashlib.sha256((checkpoint / "config.json").read_bytes())
    weights = checkpoint / "model.safetensors"
    if weights.is_file():
        stat = weights.stat()
        digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    return f"{policy_type}-{digest.hexdigest()[:12]}"
