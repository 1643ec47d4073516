"""LeRobot checkpoints served unchanged: ``model.source = "lerobot"``.

A directory written by LeRobot's ``save_pretrained`` (or a hub id already in the local Hugging
Face cache: servo never downloads) is loaded with LeRobot's own classes: the policy type comes
from its ``config.json``, weights from ``model.safetensors``, and every request goes through the
checkpoint's own pre/post-processor pipelines (normalisation, tokenisation, relative actions…),
one copy of them per session. Chunks come from ``predict_action_chunk``, the call LeRobot's
asynchronous inference server makes; flow-matching policies that implement real-time chunking
(SmolVLA, Pi0-family) get ``inference_delay`` and ``prev_chunk_left_over`` — LeRobot's
guidance, run on the server (docs/design/latency.md §6).

Chunk length: ``predict_action_chunk`` returns the whole predicted horizon, ``chunk_size`` steps
(ACT, SmolVLA, Pi0) — ``n_action_steps`` only bounds how much of it LeRobot's synchronous
``select_action`` executes before predicting again. servo, like LeRobot's async inference, serves
the whole horizon: the edge's queue and RTC merge decide how much of it runs. Diffusion
generates ``horizon`` steps and returns the ``n_action_steps`` starting at the current
observation, so that is its chunk.

Diffusion-family policies condition on the last ``n_obs_steps`` observations. That history is
instance state (as in LeRobot, where it lives in the policy's queues), so such policies are
chunk-stateful and served exclusive. Its entries are the observations of consecutive requests,
not of consecutive control ticks as in training: with ``n_obs_steps > 1`` expect degraded
behaviour unless requests are made every tick.

LeRobot (>= 0.5, Python >= 3.12) is imported when a policy is built, never at module import.
"""

from __future__ import annotations

import copy
import os
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from servo.config import convert
from servo.logs import get_logger
from servo.policy.errors import PolicyLoadError
from servo.policy.frames import PinnedStager, is_cuda, stack_on_device
from servo.policy.lerobot_checkpoint import (
    ACTION_KEY,
    STATE_KEY,
    LeRobotOptions,
    camera_keys,
    declared_units,
    fingerprint,
    resolve_checkpoint,
)
from servo.policy.lerobot_metadata import CheckpointFacts, read_facts
from servo.policy.protocol import DecodedObservation, FloatArray, PolicySpec, Prepared
from servo.wire import CameraFeature, Features, Tuning

log = get_logger(__name__)

#: Config options that set how many denoising / flow steps a forward runs (fewer: faster).
STEP_OPTIONS = ("num_inference_steps", "num_steps")


def make_lerobot_policy(*, device: str = "cpu", **options: Any) -> LeRobotPolicy:
    """Factory of the policy registry (manifest ``model.source = "lerobot"``).

    Raises:
        ConfigError: an option that cannot be used (the message starts with its name).
        PolicyLoadError: LeRobot missing, or a checkpoint servo cannot serve.
    """
    return LeRobotPolicy(convert(options, LeRobotOptions), device=device)


class LeRobotProcessor:
    """One session's copies of the checkpoint's pre/post-processor pipelines.

    Owned by the thread that runs inference for the session. The copies are made together, so
    a relative-action step and the absolute step that reads its cached state stay paired.
    """

    def __init__(self, policy: LeRobotPolicy, pre: Any, post: Any) -> None:
        from lerobot.processor import NormalizerProcessorStep, RelativeActionsProcessorStep

        self._policy = policy
        self._pre = pre
        self._post = post
        relative = [s for s in pre.steps if isinstance(s, RelativeActionsProcessorStep) and s.enabled]
        self._relative = relative[0] if relative else None
        normalizer = [s for s in pre.steps if isinstance(s, NormalizerProcessorStep)]
        self._normalizer = normalizer[0] if normalizer else None

    def preprocess(self, obs: DecodedObservation) -> Prepared:
        """Build LeRobot's batch, run the preprocessor, bring the RTC prefix into model space."""
        batch = self._pre(self._policy.raw_batch(obs))
        prefix = None
        if self._policy.rtc:
            # With relative actions, model space moves with the state just cached: the absolute
            # (robot-space) prefix is re-anchored on it, as LeRobot's own RTC engine does.
            prefix = obs.prefix_model if self._relative is None else self._reanchor(obs.prefix_robot)
        return Prepared(batch=batch, prefix=prefix)

    def postprocess(self, chunk: FloatArray) -> FloatArray:
        """Model-space (T, A) chunk -> robot space, through the checkpoint's postprocessor."""
        import torch

        out = self._post(torch.from_numpy(np.array(chunk, dtype=np.float32)).unsqueeze(0))
        return np.asarray(out.squeeze(0).float().cpu().numpy(), dtype=np.float32)

    def reset(self) -> None:
        """Episode boundary: forget cached states."""
        self._pre.reset()
        self._post.reset()

    def _reanchor(self, prefix_robot: FloatArray | None) -> FloatArray | None:
        import torch
        from lerobot.policies.rtc import reanchor_relative_rtc_prefix

        state = None if self._relative is None else self._relative.get_cached_state()
        if prefix_robot is None or len(prefix_robot) == 0 or state is None:
            return None
        model = reanchor_relative_rtc_prefix(
            prev_actions_absolute=torch.from_numpy(np.array(prefix_robot, dtype=np.float32)),
            current_state=state,
            relative_step=self._relative,
            normalizer_step=self._normalizer,
            policy_device="cpu",
        )
        return np.asarray(model.squeeze(0).float().numpy(), dtype=np.float32)


class LeRobotPolicy:
    """A LeRobot ``PreTrainedPolicy`` behind servo's adapter protocol.

    Owned by the inference thread (server worker or local engine); `spec` may be read anywhere.
    """

    def __init__(self, options: LeRobotOptions, *, device: str = "cpu") -> None:
        self.options = options
        self.device = device
        lerobot = _import_lerobot()
        checkpoint, hub_id = resolve_checkpoint(options.path, options.revision)
        #: fps, names, units and camera renames, each with where it came from.
        self.facts: CheckpointFacts = read_facts(checkpoint, options)
        # LeRobot raises whatever its config parser, torch or transformers raise: at this boundary
        # any failure is "this checkpoint cannot be served", said once with the cause.
        try:
            config = lerobot.PreTrainedConfig.from_pretrained(str(checkpoint), local_files_only=True)
        except Exception as exc:
            raise PolicyLoadError(f"{checkpoint}/config.json is not a LeRobot policy config: {exc}") from exc
        config.device = device
        try:
            policy = lerobot.get_policy_class(config.type).from_pretrained(str(checkpoint), config=config)
            self._pre, self._post = lerobot.make_pre_post_processors(
                config,
                pretrained_path=str(checkpoint),
                preprocessor_overrides={"device_processor": {"device": device}},
            )
        except Exception as exc:
            cause = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            vlm = getattr(config, "vlm_model_name", "")
            if isinstance(exc, OSError) and vlm:
                cause += f" (servo never downloads: the VLM config and tokenizer {vlm!r} must be in the local cache)"
            raise PolicyLoadError(f"cannot load LeRobot {config.type} checkpoint {str(checkpoint)!r}: {cause}") from exc
        policy.eval()
        # Served, never trained (docs/design/serving.md §6): no autograd bookkeeping on the weights. RTC guidance
        # then differentiates only with respect to the noisy chunk.
        policy.requires_grad_(False)
        self.rtc = options.rtc and bool(policy.supports_rtc())
        if self.rtc:
            config.rtc_config = lerobot.RTCConfig(
                execution_horizon=options.execution_horizon, max_guidance_weight=options.max_guidance_weight
            )
            policy.init_rtc_processor()
        self._policy = policy
        self._config = config
        self._camera_keys = camera_keys(config, self.facts.camera_renames)
        self._image_hw = {key: tuple(config.image_features[key].shape[1:]) for key in self._camera_keys.values()}
        #: Diffusion-family observation history (see the module docstring); None for the others.
        steps = int(getattr(config, "n_obs_steps", 1))
        self._history: deque[dict[str, Any]] | None = deque(maxlen=steps) if config.type == "diffusion" else None
        if self._history is None and steps > 1:
            raise PolicyLoadError(
                f"LeRobot {config.type} checkpoint conditions on {steps} past observations; servo serves "
                "observation history only for diffusion"
            )
        self._spec = self._build_spec(checkpoint, hub_id)
        # Host frames reach a GPU through pinned buffers and non-blocking copies (inference thread).
        self._stager = PinnedStager(device) if is_cuda(device) else None
        log.info(
            "lerobot policy loaded",
            type=config.type,
            checkpoint=str(checkpoint),
            device=device,
            rtc=self.rtc,
            chunk_size=self._spec.chunk_size,
            facts=self.facts.describe(),
        )

    @property
    def spec(self) -> PolicySpec:
        """Static description, from the checkpoint's features and the options."""
        return self._spec

    def make_processor(self) -> LeRobotProcessor:
        """Fresh copies of the pipelines; tokenizers (read-only and large) are shared, not copied."""
        from lerobot.processor import TokenizerProcessorStep

        shared: dict[int, Any] = {}
        for step in self._pre.steps:
            if isinstance(step, TokenizerProcessorStep):
                shared.update({id(t): t for t in (step.input_tokenizer, step.tokenizer) if t is not None})
        pre, post = copy.deepcopy((self._pre, self._post), memo=shared)
        return LeRobotProcessor(self, pre, post)

    def raw_batch(self, obs: DecodedObservation) -> dict[str, Any]:
        """LeRobot's observation dict: (1, D) state, (1, 3, H, W) float images in [0, 1], the task.

        Frames may be host arrays or tensors already on the device (``spec.device_frames``). Images
        are contiguous channels-first, the memory layout LeRobot's ``prepare_observation_for_inference``
        gives them: a convolution over a permuted (channels-last) view sums in another order, and
        the chunks then differ from LeRobot's in the last float bits.
        """
        import torch
        import torch.nn.functional as F

        # Decoded observations may be read-only views of the message: torch wants its own memory.
        batch: dict[str, Any] = {STATE_KEY: torch.from_numpy(np.array(obs.state, dtype=np.float32)).unsqueeze(0)}
        for camera, key in self._camera_keys.items():
            image = stack_on_device([obs.images[camera]], self.device, self._stager)
            image = image.float().div_(255.0).permute(0, 3, 1, 2).contiguous()
            if tuple(image.shape[-2:]) != self._image_hw[key]:
                image = F.interpolate(image, size=self._image_hw[key], mode="bilinear", antialias=True).contiguous()
            batch[key] = image
        batch["task"] = [obs.task]
        batch["robot_type"] = ""
        return batch

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: FloatArray | None) -> FloatArray:
        """``predict_action_chunk`` with RTC guidance when enabled; (1, T, A) -> (T, A) model space."""
        import torch

        if self._history is not None:
            batch = self._with_history(batch)
        if self.rtc and prefix is not None and len(prefix) > 0:
            left_over = torch.from_numpy(np.array(prefix, dtype=np.float32)).to(self.device)
            # RTC guidance differentiates through the denoiser output: autograd must be available,
            # which inference mode (the runner's default) forbids.
            with torch.inference_mode(False):
                chunk = self._policy.predict_action_chunk(
                    batch, inference_delay=inference_delay, prev_chunk_left_over=left_over
                )
        else:
            chunk = self._policy.predict_action_chunk(batch)
        return np.asarray(chunk.squeeze(0).float().cpu().numpy(), dtype=np.float32)

    def reset(self) -> None:
        """Episode boundary: forget the observation history (and LeRobot's own queues)."""
        if self._history is not None:
            self._history.clear()
        self._policy.reset()

    def _with_history(self, batch: dict[str, Any]) -> dict[str, Any]:
        import torch

        assert self._history is not None
        keys = [STATE_KEY, *self._camera_keys.values()]
        current = {key: batch[key] for key in keys}
        if not self._history:
            self._history.extend([current] * (self._history.maxlen or 1))  # LeRobot pads with the first
        else:
            self._history.append(current)
        stacked = dict(batch)
        for key in keys:
            stacked[key] = torch.stack([entry[key] for entry in self._history], dim=1)
        return stacked

    def _build_spec(self, checkpoint: Path, hub_id: str) -> PolicySpec:
        config, options = self._config, self.options
        state = config.input_features.get(STATE_KEY)
        action = config.output_features.get(ACTION_KEY)
        if state is None or action is None:
            raise PolicyLoadError(
                f"LeRobot {config.type} checkpoint has no {STATE_KEY!r} input or {ACTION_KEY!r} output; "
                "servo serves robots that send joint states"
            )
        extra = sorted(
            key for key in config.input_features if key != STATE_KEY and key not in self._camera_keys.values()
        )
        if extra:
            raise PolicyLoadError(f"LeRobot {config.type} checkpoint needs inputs servo does not send: {extra}")
        facts = self.facts
        cameras = {
            camera: CameraFeature(*(int(v) for v in self._image_hw[key])) for camera, key in self._camera_keys.items()
        }
        return PolicySpec(
            model=options.name or hub_id or f"lerobot/{config.type}",
            revision=fingerprint(checkpoint, config.type),
            features=Features(
                state_names=facts.state_names,
                action_names=facts.action_names,
                cameras=cameras,
                state_units=declared_units(facts.units, facts.state_names),
                action_units=declared_units(facts.units, facts.action_names),
            ),
            chunk_size=self._chunk_size(),
            fps=facts.fps,
            supports_rtc=self.rtc,
            chunk_stateless=self._history is None,
            device_frames=True,
            tuning=self._tuning(),
        )

    def _tuning(self) -> Tuning:
        """What sets this type's chunk length and what shortens its forward, as its config.json names them."""
        config = self._config
        faster = []
        for name in STEP_OPTIONS:
            if hasattr(config, name):
                value = getattr(config, name)
                if value is None:  # Diffusion: as many as it was trained with
                    value = getattr(config, "num_train_timesteps", None)
                faster.append(f"{name} ({value} now)")
        if self._history is None:
            return Tuning(chunk="chunk_size", faster=faster)
        horizon, n_obs = getattr(config, "horizon", None), int(getattr(config, "n_obs_steps", 1))
        if horizon is None:
            return Tuning(chunk="n_action_steps", faster=faster)
        why = f"horizon {horizon} - n_obs_steps {n_obs} + 1; a longer horizon means retraining"
        return Tuning(chunk="n_action_steps", chunk_max=int(horizon) - n_obs + 1, chunk_max_why=why, faster=faster)

    def _chunk_size(self) -> int:
        config = self._config
        if self._history is not None:
            return int(config.n_action_steps)
        size = getattr(config, "chunk_size", None)
        if size is None:
            raise PolicyLoadError(f"LeRobot {config.type} does not predict action chunks (no chunk_size)")
        return int(size)


class _LeRobot:
    """The few LeRobot entry points the adapter uses, imported once. Immutable: any thread may use it."""

    def __init__(self) -> None:
        from lerobot.configs.policies import PreTrainedConfig
        from lerobot.policies.factory import get_policy_class, make_pre_post_processors
        from lerobot.policies.rtc.configuration_rtc import RTCConfig

        self.PreTrainedConfig = PreTrainedConfig
        self.get_policy_class = get_policy_class
        self.make_pre_post_processors = make_pre_post_processors
        self.RTCConfig = RTCConfig


def _import_lerobot() -> _LeRobot:
    # servo never downloads: hub lookups LeRobot or transformers make while loading (a VLM's
    # config, a tokenizer) must be answered by the local cache. Read when huggingface_hub is first
    # imported, which in a server is here; an explicit setting wins.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        return _LeRobot()
    except ImportError as exc:
        raise PolicyLoadError(
            f"source 'lerobot' needs LeRobot >= 0.5 on Python >= 3.12: pip install 'servo-robotics[lerobot]' ({exc})"
        ) from exc
