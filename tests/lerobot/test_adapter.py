"""``model.source = "lerobot"``: LeRobot checkpoints behind servo's adapter protocol, unchanged."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("lerobot", minversion="0.5", reason="needs servo-robotics[lerobot] (Python >= 3.12)")

import torch

from servo.policy import DecodedObservation, PolicyLoadError, load_policy
from servo.policy.lerobot_checkpoint import LEROBOT_ARM_JOINTS
from servo.policy.runner import InferenceRunner
from servo.wire import CameraFeature
from tests.lerobot.checkpoints import CAMERA, CHUNK, HEIGHT, STATE_MEAN, STATE_STD, WIDTH

RNG = np.random.default_rng(7)


def observation(task: str = "pick the red cube") -> DecodedObservation:
    state = (np.asarray(STATE_MEAN) + RNG.normal(0, 5, 6)).astype(np.float32)
    frame = RNG.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)
    return DecodedObservation(state=state, images={CAMERA: frame}, task=task)


def lerobot_way(checkpoint: Path) -> tuple[Any, Any, Any]:
    """Policy and pipelines loaded as LeRobot's own async-inference server loads them."""
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    config = PreTrainedConfig.from_pretrained(str(checkpoint))
    policy = get_policy_class(config.type).from_pretrained(str(checkpoint))
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(checkpoint))
    return policy, pre, post


def lerobot_batch(obs: DecodedObservation) -> dict[str, Any]:
    """``prepare_observation_for_inference``'s output for the same observation (its memory layout too)."""
    from lerobot.policies.utils import prepare_observation_for_inference

    observation = {"observation.state": obs.state.copy(), f"observation.images.{CAMERA}": obs.images[CAMERA].copy()}
    batch = prepare_observation_for_inference(observation, torch.device("cpu"), task=obs.task, robot_type="")
    batch["task"] = [obs.task]
    return batch


def own_batch(obs: DecodedObservation) -> dict[str, Any]:
    """The same, written out (the layout LeRobot gives: float, [0, 1], contiguous channels-first)."""
    image = torch.from_numpy(obs.images[CAMERA].copy()).float().div(255).permute(2, 0, 1).contiguous().unsqueeze(0)
    return {
        "observation.state": torch.from_numpy(obs.state.copy()).unsqueeze(0),
        f"observation.images.{CAMERA}": image,
        "task": [obs.task],
        "robot_type": "",
    }


def test_act_chunks_are_exactly_what_lerobot_computes(act_checkpoint: Path) -> None:
    """Raw frames: the very numbers, to the last bit (the same layout, the same sums)."""
    served = load_policy("lerobot", {"path": str(act_checkpoint)})
    runner, processor = InferenceRunner(served), served.make_processor()
    policy, pre, post = lerobot_way(act_checkpoint)
    for _ in range(3):
        obs = observation()
        model, robot = runner.infer(processor, obs, 0)
        theirs = lerobot_batch(obs)
        image = theirs[f"observation.images.{CAMERA}"]
        assert image.is_contiguous()
        assert torch.equal(image, own_batch(obs)[f"observation.images.{CAMERA}"])
        with torch.no_grad():
            expected_model = policy.predict_action_chunk(pre(theirs))
            expected_robot = post(expected_model)
        assert model.shape == robot.shape == (CHUNK, 6)
        np.testing.assert_array_equal(model, expected_model.squeeze(0).numpy())
        np.testing.assert_array_equal(robot, expected_robot.squeeze(0).numpy())


def test_spec_comes_from_the_checkpoint(
    act_checkpoint: Path, smolvla_checkpoint: Path, diffusion_checkpoint: Path
) -> None:
    checkpoints = {"act": act_checkpoint, "smolvla": smolvla_checkpoint, "diffusion": diffusion_checkpoint}
    specs = {name: load_policy("lerobot", {"path": str(path)}).spec for name, path in checkpoints.items()}
    for name, spec in specs.items():
        assert spec.model == f"lerobot/{name}"
        assert spec.revision.startswith(f"{name}-")
        assert spec.features.action_names == spec.features.state_names == list(LEROBOT_ARM_JOINTS)
        assert spec.features.cameras == {CAMERA: CameraFeature(HEIGHT, WIDTH)}
        assert spec.features.action_units == spec.features.state_units == []  # LeRobot does not record units
    # The whole predicted horizon (what LeRobot's async inference ships); Diffusion's n_action_steps.
    assert [specs[n].chunk_size for n in ("act", "smolvla", "diffusion")] == [CHUNK, CHUNK, 8]
    assert [specs[n].supports_rtc for n in ("act", "smolvla", "diffusion")] == [False, True, False]
    assert [specs[n].chunk_stateless for n in ("act", "smolvla", "diffusion")] == [True, True, False]


def test_options_name_actions_units_and_cameras(act_checkpoint: Path) -> None:
    names = [f"joint{i}" for i in range(6)]
    spec = load_policy(
        "lerobot",
        {
            "path": str(act_checkpoint),
            "name": "acme/act_sweep",
            "action_names": names,
            "units": "range_m100_100",
            "cameras": {"top": CAMERA},
            "fps": 15,
        },
    ).spec
    assert spec.model == "acme/act_sweep"
    assert spec.features.action_names == spec.features.state_names == names
    assert spec.features.action_units == ["range_m100_100"] * 6  # no joint named gripper*
    assert spec.features.cameras == {"top": CameraFeature(HEIGHT, WIDTH)}
    assert spec.fps == 15
    arm = load_policy("lerobot", {"path": str(act_checkpoint), "units": "degrees"}).spec
    assert arm.features.action_units == ["degrees"] * 5 + ["range_0_100"]


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"pathh": "x"}, ("model.options.pathh: unknown key", "path")),
        ({}, ("model.options.path: required key is missing",)),
        ({"path": "{ckpt}", "fps": 0}, ("model.options.fps = 0",)),
        ({"path": "{ckpt}", "action_names": ["a", "b"]}, ("6 action values", "model.options.action_names")),
        ({"path": "{ckpt}", "units": ["degrees"]}, ("model.options.units", "1 units for 6")),
        ({"path": "{ckpt}", "cameras": {"top": "side"}}, ("model.options.cameras", "'side'", "'front'")),
        ({"path": "nobody/not_in_cache"}, ("neither a checkpoint directory nor a hub id in the local cache",)),
        ({"path": "{tmp}"}, ("has no config.json",)),
    ],
)
def test_bad_options_are_refused_with_the_key(
    act_checkpoint: Path, tmp_path: Path, options: dict[str, Any], words: tuple[str, ...]
) -> None:
    paths = {"{ckpt}": str(act_checkpoint), "{tmp}": str(tmp_path)}
    options = {key: paths.get(value, value) if isinstance(value, str) else value for key, value in options.items()}
    with pytest.raises(PolicyLoadError) as info:
        load_policy("lerobot", options)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_flow_matching_rtc_follows_the_prefix_like_lerobot(smolvla_checkpoint: Path) -> None:
    served = load_policy("lerobot", {"path": str(smolvla_checkpoint)})
    runner, processor = InferenceRunner(served), served.make_processor()
    obs = observation()
    torch.manual_seed(0)
    first, _ = runner.infer(processor, obs, 0)
    delay, prefix = 3, first[5:15].copy()  # what the edge still had queued, in model space
    obs.prefix_model = prefix
    torch.manual_seed(1)
    guided, _ = runner.infer(processor, obs, delay)
    obs.prefix_model = None
    torch.manual_seed(1)
    free, _ = runner.infer(processor, obs, delay)
    # Guidance pulls the steps that execute during inference onto the prefix.
    assert np.abs(guided[:delay] - prefix[:delay]).max() < 0.25 * np.abs(free[:delay] - prefix[:delay]).max()

    policy, pre, _ = lerobot_way(smolvla_checkpoint)
    from lerobot.policies.rtc.configuration_rtc import RTCConfig

    policy.config.rtc_config = RTCConfig(execution_horizon=10)
    policy.init_rtc_processor()
    torch.manual_seed(1)
    with torch.no_grad():
        expected = policy.predict_action_chunk(
            pre(lerobot_batch(obs)), inference_delay=delay, prev_chunk_left_over=torch.from_numpy(prefix)
        )
    np.testing.assert_allclose(guided, expected.squeeze(0).numpy(), rtol=1e-4, atol=1e-4)


def test_each_session_has_its_own_relative_action_state(relative_act_checkpoint: Path) -> None:
    served = load_policy("lerobot", {"path": str(relative_act_checkpoint)})
    a, b = served.make_processor(), served.make_processor()
    obs_a, obs_b = observation(), observation()
    a.preprocess(obs_a)
    b.preprocess(obs_b)  # a second robot's request between a's two halves
    delta = np.linspace(-1, 1, CHUNK * 6, dtype=np.float32).reshape(CHUNK, 6)
    # Unnormalise, then add the state this session cached: LeRobot's AbsoluteActionsProcessorStep.
    expected_a = delta * STATE_STD + np.asarray(STATE_MEAN, np.float32) + obs_a.state
    np.testing.assert_allclose(a.postprocess(delta), expected_a, rtol=1e-5, atol=1e-4)
    shift = np.broadcast_to(obs_b.state - obs_a.state, (CHUNK, 6))
    np.testing.assert_allclose(b.postprocess(delta) - a.postprocess(delta), shift, atol=1e-4)


def test_relative_rtc_prefix_is_reanchored_on_the_new_state(relative_smolvla_checkpoint: Path) -> None:
    served = load_policy("lerobot", {"path": str(relative_smolvla_checkpoint)})
    obs = observation()
    obs.prefix_robot = (obs.state + RNG.normal(0, 3, (10, 6))).astype(np.float32)
    obs.prefix_model = np.full((10, 6), 99.0, np.float32)  # relative to an older state: must not be used
    prepared = served.make_processor().preprocess(obs)
    expected = (obs.prefix_robot - obs.state - np.asarray(STATE_MEAN, np.float32)) / STATE_STD
    assert prepared.prefix is not None
    np.testing.assert_allclose(prepared.prefix, expected, rtol=1e-5, atol=1e-5)


def test_diffusion_history_matches_lerobot_and_resets(diffusion_checkpoint: Path) -> None:
    served = load_policy("lerobot", {"path": str(diffusion_checkpoint)})
    runner, processor = InferenceRunner(served), served.make_processor()
    policy, pre, _ = lerobot_way(diffusion_checkpoint)
    obs, later = observation(), observation()

    torch.manual_seed(0)
    first, _ = runner.infer(processor, obs, 0)
    torch.manual_seed(0)
    with torch.no_grad():
        lerobot_first = policy.select_action(pre(lerobot_batch(obs)))  # pads its history with obs
    np.testing.assert_allclose(first[0], lerobot_first.squeeze(0).numpy(), rtol=1e-4, atol=1e-4)

    torch.manual_seed(0)
    with_history, _ = runner.infer(processor, later, 0)  # history: (obs, later)
    served.reset()
    torch.manual_seed(0)
    fresh, _ = runner.infer(processor, later, 0)  # history: (later, later)
    assert not np.allclose(with_history, fresh)
    served.reset()
    torch.manual_seed(0)
    again, _ = runner.infer(processor, later, 0)
    np.testing.assert_array_equal(fresh, again)


def test_a_rewritten_checkpoint_is_a_new_revision(act_checkpoint: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(act_checkpoint, tmp_path / "ckpt"))
    before = load_policy("lerobot", {"path": str(copy)}).spec.revision
    from tests.lerobot.checkpoints import build_act

    build_act(copy)  # retrained in place
    assert load_policy("lerobot", {"path": str(copy)}).spec.revision != before


def test_a_missing_vlm_is_named_not_downloaded(smolvla_checkpoint: Path, tmp_path: Path) -> None:
    checkpoint = Path(shutil.copytree(smolvla_checkpoint, tmp_path / "ckpt", ignore=shutil.ignore_patterns("vlm")))
    config = checkpoint / "config.json"
    config.write_text(config.read_text().replace(str(smolvla_checkpoint / "vlm"), "nobody/tiny-vlm"))
    with pytest.raises(PolicyLoadError) as info:
        load_policy("lerobot", {"path": str(checkpoint)})
    message = str(info.value)
    assert "cannot load LeRobot smolvla checkpoint" in message
    assert "the VLM config and tokenizer 'nobody/tiny-vlm' must be in the local cache" in message
