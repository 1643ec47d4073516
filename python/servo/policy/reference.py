"""The built-in reference policy: a small torch vision+state network with a motion prior.

It makes a server useful with nothing downloaded: the arm sweeps a smooth loop in
(shoulder_pan, shoulder_lift) with the other joints following the phase, and a fixed-seed
convolutional encoder over the camera frames adds a small residual, so the camera path is
exercised for real. ``compute_ms`` pads each forward to emulate a larger model.

Actions are predicted relative to the observed state (like LeRobot's relative-action policies),
which is what makes the per-session processor stateful: it caches the state at preprocess and
adds it back at postprocess.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from servo.policy.frames import PinnedStager, is_cuda, stack_on_device
from servo.policy.graphs import GraphedCallable
from servo.policy.protocol import DecodedObservation, FloatArray, PolicySpec, Prepared
from servo.wire import CameraFeature, Features, Tuning

if TYPE_CHECKING:
    import torch

SO100_JOINTS = (
    "shoulder_pan.pos",
    "shoulder_lift.pos",
    "elbow_flex.pos",
    "wrist_flex.pos",
    "wrist_roll.pos",
    "gripper.pos",
)
#: The SO-100's units with LeRobot's ``use_degrees=True``: the motion prior is in these.
SO100_UNITS = ("degrees",) * 5 + ("range_0_100",)

#: Encoder input resolution: frames are area-downsampled to this before the convolutions.
_ENCODER_HW = (96, 128)


@dataclass(frozen=True)
class MotionPrior:
    """A limit cycle in (pan, lift): radius and centre in degrees, one lap every ``period_s``."""

    center: tuple[float, float] = (0.0, 0.0)
    radius: float = 20.0
    period_s: float = 6.0
    settle_s: float = 0.5

    def deltas(self, state: FloatArray, chunk_size: int, fps: float) -> FloatArray:
        """Targets for the next ``chunk_size`` steps, relative to ``state``."""
        dp, dl = float(state[0]) - self.center[0], float(state[1]) - self.center[1]
        r0 = math.hypot(dp, dl)
        theta0 = math.atan2(dl, dp) if r0 > 1e-3 else 0.0
        t = np.arange(1, chunk_size + 1, dtype=np.float64) / fps
        theta = theta0 + 2 * math.pi * t / self.period_s
        radius = self.radius + (r0 - self.radius) * np.exp(-t / self.settle_s)
        targets = np.zeros((chunk_size, len(state)), dtype=np.float64)
        targets[:, 0] = self.center[0] + radius * np.cos(theta)
        targets[:, 1] = self.center[1] + radius * np.sin(theta)
        extra = (
            15.0 * np.sin(theta),
            10.0 * np.cos(theta),
            np.zeros_like(theta),
            50.0 + 30.0 * np.sin(theta),
        )
        for j, column in enumerate(extra[: max(0, len(state) - 2)]):
            targets[:, 2 + j] = column
        return (targets - state.astype(np.float64)).astype(np.float32)


class RelativeProcessor:
    """Per-session processor: model actions are deltas from the state seen at preprocess.

    Owned by the inference thread of one session.
    """

    def __init__(self, cameras: tuple[str, ...], device: str) -> None:
        self._cameras = cameras
        self._device = device
        self._state: FloatArray | None = None
        # Host frames reach a GPU through pinned buffers and non-blocking copies.
        self._stager = PinnedStager(device) if is_cuda(device) else None

    def preprocess(self, obs: DecodedObservation) -> Prepared:
        """Cache the state, stack frames into a (N, H, W, 3) device tensor, re-anchor the RTC prefix.

        Frames may be host arrays or tensors already on the device (``spec.device_frames``).
        """
        import torch

        state = np.array(obs.state, dtype=np.float32)
        self._state = state
        frames = [obs.images[name] for name in self._cameras]
        # Cameras of one size are encoded as one batch; runs of other sizes as batches of their own.
        runs: list[list[Any]] = []
        for frame in frames:
            if runs and tuple(runs[-1][0].shape) == tuple(frame.shape):
                runs[-1].append(frame)
            else:
                runs.append([frame])
        batch = {
            "state": torch.from_numpy(state).to(self._device),
            "images": tuple(stack_on_device(run, self._device, self._stager) for run in runs),
            "raw_state": state,
        }
        # The model-space prefix was relative to an older state; re-anchoring the robot-space
        # prefix on the current state keeps RTC conditioning consistent (docs/design/latency.md §6).
        if obs.prefix_robot is not None:
            prefix: FloatArray | None = (obs.prefix_robot - state).astype(np.float32)
        else:
            prefix = obs.prefix_model
        return Prepared(batch=batch, prefix=prefix)

    def postprocess(self, chunk: FloatArray) -> FloatArray:
        """Add the cached state back: robot-space absolute targets."""
        if self._state is None:
            raise RuntimeError("postprocess called before preprocess")
        return (chunk + self._state).astype(np.float32)

    def reset(self) -> None:
        """Forget the cached state."""
        self._state = None


class ReferencePolicy:
    """Reference chunking policy; chunk-stateless, RTC-capable. Owned by the inference thread."""

    def __init__(
        self,
        *,
        chunk_size: int = 50,
        fps: float = 30.0,
        cameras: dict[str, tuple[int, int]] | None = None,
        joint_names: tuple[str, ...] = SO100_JOINTS,
        units: str | tuple[str, ...] | None = None,
        compute_ms: float = 0.0,
        residual_scale: float = 0.5,
        rtc_blend_steps: int = 10,
        seed: int = 0,
        device: str = "cpu",
        prior: MotionPrior | None = None,
    ) -> None:
        import torch
        from torch import nn

        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        cams = {"front": (480, 640), "wrist": (480, 640)} if cameras is None else dict(cameras)
        declared = _declared_units(units, tuple(joint_names))
        self._spec = PolicySpec(
            model="servo/reference",
            revision=f"seed{seed}",
            features=Features(
                state_names=list(joint_names),
                action_names=list(joint_names),
                cameras={name: CameraFeature(h, w) for name, (h, w) in cams.items()},
                state_units=declared,
                action_units=declared,
            ),
            chunk_size=chunk_size,
            fps=fps,
            supports_rtc=True,
            chunk_stateless=True,
            device_frames=True,
            tuning=Tuning(
                chunk="model.options.chunk_size",
                faster=[f"model.options.compute_ms ({compute_ms:g} now)"] if compute_ms else [],
            ),
        )
        self._cameras = tuple(cams)
        self._device = device
        self._compute_s = compute_ms / 1000.0
        self._residual_scale = residual_scale
        self._rtc_blend_steps = rtc_blend_steps
        self._prior = prior or MotionPrior()
        dim = len(joint_names)
        generator = torch.Generator().manual_seed(seed)
        self._encoder = nn.Sequential(
            nn.Conv2d(3, 16, 5, stride=2, padding=2),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, stride=2, padding=1),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self._head = nn.Sequential(
            nn.Linear(32 * len(self._cameras) + dim, 128),
            nn.Tanh(),
            nn.Linear(128, chunk_size * dim),
            nn.Tanh(),
        )
        with torch.no_grad():
            for param in [*self._encoder.parameters(), *self._head.parameters()]:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
        self._encoder.to(device).eval()
        self._head.to(device).eval()
        #: What the forward calls: the networks, or their compiled versions (`compile`).
        self._encode: Callable[[torch.Tensor], torch.Tensor] = self._encoder
        self._decode: Callable[[torch.Tensor], torch.Tensor] = self._head
        self._network: Callable[..., torch.Tensor] = self._forward_network

    @property
    def spec(self) -> PolicySpec:
        """Static description."""
        return self._spec

    def compile(self) -> None:
        """Wrap the networks in ``torch.compile`` (compiled during warm-up)."""
        import torch

        self._encode = torch.compile(self._encoder)
        self._decode = torch.compile(self._head)

    def use_cuda_graphs(self) -> None:
        """Replay the networks (frames and state to residual) from CUDA graphs, one per input shape."""
        self._network = GraphedCallable(self._forward_network)

    def make_processor(self) -> RelativeProcessor:
        """A fresh per-session processor."""
        return RelativeProcessor(self._cameras, self._device)

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: FloatArray | None) -> FloatArray:
        """Motion prior + vision residual, continued from ``prefix`` over the delay (RTC)."""
        start = time.perf_counter()
        spec = self._spec
        dim = len(spec.features.action_names)
        state: FloatArray = batch["raw_state"]
        residual = self._residual(batch).reshape(spec.chunk_size, dim)
        chunk = self._prior.deltas(state, spec.chunk_size, spec.fps) + residual * self._residual_scale
        if prefix is not None and len(prefix) > 0:
            chunk = self._continue_prefix(chunk, prefix, inference_delay)
        remaining = self._compute_s - (time.perf_counter() - start)
        if remaining > 0:
            time.sleep(remaining)  # stands in for a GPU forward: releases the GIL like one
        return chunk.astype(np.float32)

    def reset(self) -> None:
        """Nothing to forget: the policy is chunk-stateless."""

    def _residual(self, batch: dict[str, Any]) -> FloatArray:
        return self._network(batch["state"], *batch["images"]).float().cpu().numpy()

    def _forward_network(self, state: torch.Tensor, *images: torch.Tensor) -> torch.Tensor:
        """Device-only work (no host synchronisation), so it can be recorded as a CUDA graph.

        ``images``: (N, H, W, 3) uint8 batches of the cameras in order, one per frame size.
        """
        import torch
        import torch.nn.functional as F

        features = []
        for run in images:
            x = run.permute(0, 3, 1, 2).float() / 255.0
            x = F.interpolate(x, size=_ENCODER_HW, mode="area")
            features.append(self._encode(x).reshape(-1))
        features.append(state / 100.0)
        out = self._decode(torch.cat(features).unsqueeze(0))
        return out.squeeze(0)

    def _continue_prefix(self, chunk: FloatArray, prefix: FloatArray, delay: int) -> FloatArray:
        # RTC in spirit: the first `delay` steps will already have executed from the prefix, so
        # they equal it; after that the chunk blends from the prefix into the fresh prediction.
        out = chunk.copy()
        overlap = min(len(prefix), len(chunk))
        d = max(0, min(delay, overlap))
        out[:d] = prefix[:d]
        blend = min(overlap - d, self._rtc_blend_steps)
        if blend > 0:
            w = (np.arange(1, blend + 1, dtype=np.float32) / (blend + 1))[:, None]
            out[d : d + blend] = (1 - w) * prefix[d : d + blend] + w * chunk[d : d + blend]
        return out


def _declared_units(units: str | tuple[str, ...] | None, joint_names: tuple[str, ...]) -> list[str]:
    """The units the spec declares: as given (one for all, or one per joint), else the SO-100's for its joints."""
    if units is None:
        return list(SO100_UNITS) if joint_names == SO100_JOINTS else []
    if isinstance(units, str):
        return [units] * len(joint_names)
    if len(units) != len(joint_names):
        raise ValueError(f"units: {len(units)} given for {len(joint_names)} joints (one for all, or one per joint)")
    return list(units)


def make_reference_policy(**options: Any) -> ReferencePolicy:
    """Factory used by the policy registry (manifest ``model.source = "reference"``)."""
    cameras = options.pop("cameras", None)
    if cameras is not None:
        options["cameras"] = {name: (int(h), int(w)) for name, (h, w) in dict(cameras).items()}
    for key in ("joint_names", "units"):
        if isinstance(options.get(key), list):
            options[key] = tuple(options[key])
    return ReferencePolicy(**options)
