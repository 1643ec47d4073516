"""Tiny, randomly initialised LeRobot checkpoints written with LeRobot's own ``save_pretrained``.

Nothing is downloaded: the vision backbones start from random weights, and SmolVLA's VLM (whose
config and tokenizer normally come from the hub) is a tiny stand-in built here and saved inside the
checkpoint directory — a legitimate SmolVLM config plus a word-level tokenizer carrying SmolVLM's
image special tokens. Pi0/Pi0.5 cannot be made small: their PaliGemma/Gemma sizes are fixed
variants (the smallest, gemma_300m for both, is 1.8 B parameters) and their tokenizer is a gated
hub download.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servo.policy.lerobot_checkpoint import LEROBOT_ARM_JOINTS

#: Camera of every test checkpoint; matches tests.edge.harness.small_sim (48x64).
CAMERA = "front"
HEIGHT, WIDTH = 48, 64
CHUNK = 20
#: Normalisation stats centred on a comfortable SO-100 pose, so random policies move gently.
STATE_MEAN = (0.0, -60.0, 60.0, 40.0, 0.0, 30.0)
STATE_STD = 10.0
WORDS = ["pick", "place", "the", "red", "blue", "cube", "sweep", "fold", "towel", "into", "box", "table"]


#: A camera's input size (height, width) unless given.
SIZE = (HEIGHT, WIDTH)


def _features(
    cameras: tuple[str, ...] = (CAMERA,), *, joints: int = 6, sizes: dict[str, tuple[int, int]] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    from lerobot.configs.types import FeatureType, PolicyFeature

    inputs = {"observation.state": PolicyFeature(FeatureType.STATE, (joints,))}
    for camera in cameras:
        height, width = (sizes or {}).get(camera, SIZE)
        inputs[f"observation.images.{camera}"] = PolicyFeature(FeatureType.VISUAL, (3, height, width))
    return inputs, {"action": PolicyFeature(FeatureType.ACTION, (joints,))}


def stats(cameras: tuple[str, ...] = (CAMERA,), *, joints: int = 6) -> dict[str, dict[str, Any]]:
    import torch

    mean = torch.tensor([STATE_MEAN[i % len(STATE_MEAN)] for i in range(joints)])
    vector = {"mean": mean, "std": torch.full((joints,), STATE_STD), "min": mean - 30, "max": mean + 30}
    image = {"mean": torch.full((3, 1, 1), 0.5), "std": torch.full((3, 1, 1), 0.25)}
    images = {f"observation.images.{camera}": dict(image) for camera in cameras}
    return {"observation.state": dict(vector), "action": dict(vector), **images}


def _save(path: Path, policy: Any, pre: Any, post: Any) -> Path:
    for part in (policy, pre, post):
        part.save_pretrained(path)
    return path


def build_act(
    path: Path,
    *,
    relative: bool = False,
    cameras: tuple[str, ...] = (CAMERA,),
    joints: int = 6,
    chunk: int = CHUNK,
    sizes: dict[str, tuple[int, int]] | None = None,
) -> Path:
    """A tiny ACT; with ``relative`` its pipelines convert actions to/from state-relative offsets.

    ``joints`` values of state and action, ``chunk`` steps, each camera at its ``sizes`` (48x64).
    """
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors

    inputs, outputs = _features(cameras, joints=joints, sizes=sizes)
    config = ACTConfig(
        input_features=inputs,
        output_features=outputs,
        chunk_size=chunk,
        n_action_steps=chunk,
        dim_model=32,
        n_heads=2,
        dim_feedforward=64,
        n_encoder_layers=1,
        n_decoder_layers=1,
        use_vae=False,
        pretrained_backbone_weights=None,
        device="cpu",
    )
    pre, post = make_pre_post_processors(config, dataset_stats=stats(cameras, joints=joints))
    if relative:
        pre, post = _with_relative_actions(pre, post)
    return _save(path, ACTPolicy(config), pre, post)


#: The SO-101 follower's features in LeRobot's order, as ``lerobot-record`` names them.
SO101_JOINTS = list(LEROBOT_ARM_JOINTS)


def build_trained_act(
    checkpoint: Path,
    dataset_root: Path,
    *,
    repo_id: str,
    cameras: tuple[str, ...],
    fps: int,
    joint_names: list[str] = SO101_JOINTS,
    robot_type: str = "so101_follower",
    chunk: int = CHUNK,
    sizes: dict[str, tuple[int, int]] | None = None,
) -> Path:
    """A tiny ACT in the folder ``lerobot-train`` leaves, next to the metadata of its training dataset.

    Written with LeRobot's own writers: the policy and its pipelines (``save_pretrained``), the
    train config naming the dataset (``train_config.json``), and the dataset's ``meta/info.json``
    (by default an SO-101 follower's joint names, with the cameras, at ``fps``). ``dataset_root``
    is stored as given, so a relative root is read relative to where the checkpoint is served from.
    """
    from lerobot.configs.default import DatasetConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata

    build_act(checkpoint, cameras=cameras, joints=len(joint_names), chunk=chunk, sizes=sizes)
    joints = {"dtype": "float32", "shape": [len(joint_names)], "names": joint_names}
    features: dict[str, Any] = {"action": joints, "observation.state": joints}
    for camera in cameras:
        height, width = (sizes or {}).get(camera, SIZE)
        features[f"observation.images.{camera}"] = {
            "dtype": "image",
            "shape": [height, width, 3],
            "names": ["height", "width", "channels"],
        }
    LeRobotDatasetMetadata.create(
        repo_id, fps=fps, features=features, robot_type=robot_type, root=dataset_root, use_videos=False
    )
    from lerobot.configs.policies import PreTrainedConfig

    policy = PreTrainedConfig.from_pretrained(str(checkpoint))
    train = TrainPipelineConfig(dataset=DatasetConfig(repo_id=repo_id, root=str(dataset_root)), policy=policy)
    train.save_pretrained(checkpoint)
    return checkpoint


def _with_relative_actions(pre: Any, post: Any) -> tuple[Any, Any]:
    """Insert LeRobot's relative-action steps the way its OpenPI-style policies order them.

    raw -> relative -> normalise -> model -> unnormalise -> absolute.
    """
    from lerobot.processor import (
        AbsoluteActionsProcessorStep,
        NormalizerProcessorStep,
        RelativeActionsProcessorStep,
        UnnormalizerProcessorStep,
    )

    relative = RelativeActionsProcessorStep(enabled=True)
    normalize = next(i for i, step in enumerate(pre.steps) if isinstance(step, NormalizerProcessorStep))
    pre.steps.insert(normalize, relative)
    unnormalize = next(i for i, step in enumerate(post.steps) if isinstance(step, UnnormalizerProcessorStep))
    post.steps.insert(unnormalize + 1, AbsoluteActionsProcessorStep(enabled=True, relative_step=relative))
    return pre, post


def build_tiny_vlm(path: Path) -> Path:
    """A SmolVLM config + processor small enough for a CPU test (replaces SmolVLM2-500M's hub assets)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        PreTrainedTokenizerFast,
        SmolVLMConfig,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
        SmolVLMVideoProcessor,
    )

    specials = ["<pad>", "<unk>", "<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]
    vocab = {token: i for i, token in enumerate(specials + WORDS)}
    word_level = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=word_level,
        pad_token="<pad>",
        unk_token="<unk>",
        extra_special_tokens={
            "fake_image_token": "<fake_token_around_image>",
            "image_token": "<image>",
            "global_image_token": "<global-img>",
            "end_of_utterance_token": "<end_of_utterance>",
        },
    )
    processor = SmolVLMProcessor(
        image_processor=SmolVLMImageProcessor(),
        video_processor=SmolVLMVideoProcessor(),
        tokenizer=tokenizer,
        image_seq_len=4,
    )
    processor.save_pretrained(path)
    SmolVLMConfig(
        text_config={
            "model_type": "llama",
            "vocab_size": len(vocab),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "max_position_embeddings": 256,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 64,
            "patch_size": 16,
        },
        scale_factor=2,
        image_token_id=vocab["<image>"],
        pad_token_id=vocab["<pad>"],
    ).save_pretrained(path)
    return path


def build_smolvla(path: Path, *, relative: bool = False) -> Path:
    """A tiny SmolVLA (flow matching, RTC-capable) whose VLM stand-in lives in ``path/vlm``."""
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    vlm = build_tiny_vlm(path / "vlm")
    inputs, outputs = _features()
    config = SmolVLAConfig(
        input_features=inputs,
        output_features=outputs,
        vlm_model_name=str(vlm),
        load_vlm_weights=False,
        resize_imgs_with_padding=(64, 64),
        chunk_size=CHUNK,
        n_action_steps=CHUNK,
        num_steps=4,
        max_state_dim=8,
        max_action_dim=8,
        device="cpu",
    )
    pre, post = make_pre_post_processors(config, dataset_stats=stats())
    if relative:
        pre, post = _with_relative_actions(pre, post)
    return _save(path, SmolVLAPolicy(config), pre, post)


def build_diffusion(path: Path, *, num_inference_steps: int = 2) -> Path:
    """A tiny Diffusion Policy conditioning on two observations (chunk-stateful)."""
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
    from lerobot.policies.factory import make_pre_post_processors

    inputs, outputs = _features()
    config = DiffusionConfig(
        input_features=inputs,
        output_features=outputs,
        n_obs_steps=2,
        horizon=16,
        n_action_steps=8,
        down_dims=(16, 32),
        kernel_size=3,
        diffusion_step_embed_dim=16,
        num_inference_steps=num_inference_steps,
        pretrained_backbone_weights=None,
        use_group_norm=True,
        spatial_softmax_num_keypoints=8,
        device="cpu",
    )
    pre, post = make_pre_post_processors(config, dataset_stats=stats())
    return _save(path, DiffusionPolicy(config), pre, post)
