"""What a LeRobot checkpoint folder says (fps, names, units, camera renames) and where each fact came from.

The folders are written here in the shapes LeRobot writes them (``config.json``,
``train_config.json``, ``policy_preprocessor.json`` with a ``.safetensors`` of statistics, a
dataset's ``meta/info.json``); ``tests/lerobot`` reads folders LeRobot itself wrote.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servo.cli.lerobot import lerobot_manifest
from servo.config import ConfigError
from servo.policy.lerobot_checkpoint import LEROBOT_ARM_JOINTS, LeRobotOptions
from servo.policy.lerobot_metadata import DEFAULT_FPS, read_facts

SO101 = list(LEROBOT_ARM_JOINTS)
STATS = "policy_preprocessor_step_3_normalizer_processor.safetensors"


@pytest.fixture(autouse=True)
def lerobot_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """LeRobot's cache in the test's directory: no dataset of the machine's own is found."""
    home = tmp_path / "lerobot_home"
    monkeypatch.setenv("HF_LEROBOT_HOME", str(home))
    return home


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header: dict[str, Any] = {}
    blobs, offset = [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))


def checkpoint(
    path: Path,
    *,
    dataset: dict[str, Any] | None = None,
    env: dict[str, Any] | None = None,
    reach: float = 90.0,
    rename_map: dict[str, str] | None = None,
    config: dict[str, Any] | None = None,
) -> Path:
    """A checkpoint folder as ``lerobot-train`` leaves it; ``reach`` bounds the arm's statistics."""
    path.mkdir(parents=True)
    features = {
        "observation.state": {"type": "STATE", "shape": [6]},
        "observation.images.front": {"type": "VISUAL", "shape": [3, 48, 64]},
    }
    (path / "config.json").write_text(
        json.dumps(
            {"type": "act", "input_features": features, "output_features": {"action": {"type": "ACTION", "shape": [6]}}}
            | (config or {})
        )
    )
    if dataset is not None or env is not None:
        (path / "train_config.json").write_text(json.dumps({"dataset": dataset, "env": env, "steps": 100}))
    steps = [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": rename_map or {}}},
        {"registry_name": "normalizer_processor", "config": {"eps": 1e-8}, "state_file": STATS},
    ]
    (path / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": steps}))
    bound = np.array([reach, -reach, reach / 2, 10, -10, 0], np.float32)
    gripper = np.array([0, 0, 0, 0, 0, 100], np.float32)  # 0..100 in either mode: never evidence
    write_safetensors(
        path / STATS,
        {"action.min": -np.abs(bound), "action.max": np.abs(bound) + gripper, "action.mean": np.zeros(6)},
    )
    return path


def dataset_info(
    root: Path, *, fps: int = 50, names: list[str] | None = None, robot_type: str = "so101_follower"
) -> Path:
    """A dataset's ``meta/info.json`` (LeRobot v3 layout)."""
    feature = {"dtype": "float32", "shape": [6], "names": names or SO101}
    info = {
        "codebase_version": "v3.0",
        "robot_type": robot_type,
        "fps": fps,
        "features": {"action": feature, "observation.state": feature},
    }
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(json.dumps(info))
    return root


def test_fps_names_and_robot_come_from_the_training_dataset(tmp_path: Path) -> None:
    root = dataset_info(tmp_path / "data" / "pick", fps=50)
    ckpt = checkpoint(tmp_path / "ckpt", dataset={"repo_id": "me/pick", "root": str(root)})
    facts = read_facts(ckpt, LeRobotOptions(path=str(ckpt)))
    assert facts.fps == 50
    assert facts.action_names == facts.state_names == SO101
    assert facts.robot == "so101"
    line = facts.describe()
    assert f"fps 50 and names from dataset me/pick ({root / 'meta' / 'info.json'})" in line


@pytest.mark.parametrize("where", ["home", "hub"])
def test_a_dataset_in_lerobots_cache_is_found(tmp_path: Path, lerobot_home: Path, where: str) -> None:
    if where == "home":
        dataset_info(lerobot_home / "me" / "pick", fps=15)
    else:
        dataset_info(lerobot_home / "hub" / "datasets--me--pick" / "snapshots" / "0123abc", fps=15)
    ckpt = checkpoint(tmp_path / "ckpt", dataset={"repo_id": "me/pick", "root": None})
    assert read_facts(ckpt, LeRobotOptions(path=str(ckpt))).fps == 15


def test_a_simulated_environment_gives_its_fps(tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path / "ckpt", dataset={"repo_id": "lerobot/aloha_sim"}, env={"type": "aloha", "fps": 50})
    facts = read_facts(ckpt, LeRobotOptions(path=str(ckpt)))
    assert facts.fps == 50
    assert "fps 50 from train_config.json env aloha" in facts.describe()


def test_what_is_found_nowhere_is_defaulted_and_said_so(tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path / "ckpt", dataset={"repo_id": "me/elsewhere"})
    facts = read_facts(ckpt, LeRobotOptions(path=str(ckpt)))
    assert facts.fps == DEFAULT_FPS
    assert facts.action_names == list(LEROBOT_ARM_JOINTS)
    assert facts.units == ""
    assert facts.robot is None
    line = facts.describe()
    assert "fps 30 from the default (dataset me/elsewhere not on this machine; set fps)" in line
    assert "names from the default (LeRobot's six-motor arm order)" in line
    assert "units not declared: LeRobot does not record them (--units or option units" in line
    bare = checkpoint(tmp_path / "bare")  # save_pretrained alone: no train_config.json
    assert "no training dataset named" in read_facts(bare, LeRobotOptions(path=str(bare))).describe()


def test_the_options_win(tmp_path: Path) -> None:
    root = dataset_info(tmp_path / "data", fps=50)
    ckpt = checkpoint(tmp_path / "ckpt", dataset={"repo_id": "me/pick", "root": str(root)}, reach=150)
    names = [f"j{i}" for i in range(6)]
    options = LeRobotOptions(
        path=str(ckpt), fps=10, action_names=names, units="range_m100_100", cameras={"top": "front"}
    )
    facts = read_facts(ckpt, options)
    assert (facts.fps, facts.action_names, facts.state_names, facts.units) == (10, names, SO101, "range_m100_100")
    assert facts.camera_renames == {"top": "front"}
    line = facts.describe()
    assert line.count("from the options") == 3  # fps and names together, units, cameras
    assert "robot -> checkpoint camera: top -> front, from the options" in line


def test_statistics_past_100_prove_degrees(tmp_path: Path) -> None:
    degrees = checkpoint(tmp_path / "degrees", reach=135.0)
    facts = read_facts(degrees, LeRobotOptions(path=str(degrees)))
    assert facts.units == "degrees"
    assert "an arm joint reaches 135, past -100..100" in facts.sources["units"]
    # Within -100..100 (the gripper's 100 is 0..100 in either mode): nothing is proved.
    within = checkpoint(tmp_path / "within", reach=99.0)
    assert read_facts(within, LeRobotOptions(path=str(within))).units == ""


def test_the_checkpoints_rename_map_names_the_robots_cameras(tmp_path: Path) -> None:
    renames = {"observation.images.laptop": "observation.images.front", "observation.state.x": "observation.state"}
    ckpt = checkpoint(tmp_path / "ckpt", rename_map=renames)
    facts = read_facts(ckpt, LeRobotOptions(path=str(ckpt)))
    assert facts.camera_renames == {"laptop": "front"}
    assert "laptop -> front, from its rename_map" in facts.describe()


def test_names_from_the_config_and_names_that_do_not_fit(tmp_path: Path) -> None:
    names = [f"m{i}" for i in range(6)]
    ckpt = checkpoint(tmp_path / "ckpt", config={"action_feature_names": names})
    assert read_facts(ckpt, LeRobotOptions(path=str(ckpt))).action_names == names
    # A dataset whose names do not fit the checkpoint is skipped, not believed.
    root = dataset_info(tmp_path / "data", names=["a", "b"])
    odd = checkpoint(tmp_path / "odd", dataset={"repo_id": "me/x", "root": str(root)})
    assert read_facts(odd, LeRobotOptions(path=str(odd))).action_names == list(LEROBOT_ARM_JOINTS)
    with pytest.raises(ConfigError, match=r"^action_names: the LeRobot act checkpoint has 6 action values"):
        read_facts(ckpt, LeRobotOptions(path=str(ckpt), action_names=["a"]))


def test_malformed_side_files_are_skipped(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text("{not json")
    ckpt = checkpoint(tmp_path / "ckpt", dataset={"repo_id": "me/x", "root": str(root)}, reach=150)
    (ckpt / STATS).write_bytes(struct.pack("<Q", 1 << 40))  # a header size no file has
    facts = read_facts(ckpt, LeRobotOptions(path=str(ckpt)))
    assert (facts.fps, facts.units) == (DEFAULT_FPS, "")


def test_a_checkpoint_without_names_is_told_how_to_give_them(tmp_path: Path) -> None:
    seven = {
        "input_features": {"observation.state": {"type": "STATE", "shape": [7]}},
        "output_features": {"action": {"type": "ACTION", "shape": [7]}},
    }
    ckpt = checkpoint(tmp_path / "ckpt", config=seven)
    with pytest.raises(ConfigError) as info:
        read_facts(ckpt, LeRobotOptions(path=str(ckpt)))
    assert str(info.value).startswith("action_names: the LeRobot act checkpoint does not name its 7 action values")
    assert "servo-serve --lerobot PATH --action-names NAME,NAME,… (a manifest: model.options.action_names)" in str(
        info.value
    )
    # The flag servo-serve takes, as the option it sets.
    names = [f"joint_{i}" for i in range(7)]
    manifest = lerobot_manifest(str(ckpt), {"fps": None, "units": None, "action_names": ",".join(names)}, {})
    assert manifest.model.options["action_names"] == names
    assert read_facts(ckpt, LeRobotOptions(path=str(ckpt), action_names=names)).action_names == names
