"""Frames sent at the policy's input size: the session ack offers it, the client shrinks with the
server's own function, and the policy sees the same pixels as when the server shrinks them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from servo.client import PolicyClient
from servo.wire import CameraFeature, Features
from tests.server.helpers import open_on, server_manifest
from tests.server.policies import FixedComputePolicy
from tests.support import camera_frames, client_settings, running_server

pytestmark = pytest.mark.anyio

#: The robot's cameras, and what the policy takes of them: 5x smaller, and 2.5x smaller.
ROBOT = {"front": (480, 640), "wrist": (240, 320)}
POLICY = {"front": (96, 128), "wrist": (96, 128)}


class SeeingPolicy(FixedComputePolicy):
    """Keeps the frames of every request, by ``int(state[0])`` (inference worker writes, tests read after)."""

    def __init__(self, **spec: Any) -> None:
        super().__init__(**spec)
        self.seen: dict[int, dict[str, np.ndarray]] = {}

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: Any) -> np.ndarray:
        self.seen[int(batch["state"][0])] = {name: np.array(frame) for name, frame in batch["images"].items()}
        return super().predict_chunk(batch, inference_delay, prefix)


def robot_features(policy: SeeingPolicy) -> Features:
    features = policy.spec.features
    cameras = {name: CameraFeature(h, w) for name, (h, w) in ROBOT.items()}
    return Features(features.state_names, features.action_names, cameras)


def robot_frames() -> dict[str, np.ndarray]:
    front = camera_frames(*ROBOT["front"], seed=4)["front"]
    return {"front": front, "wrist": np.ascontiguousarray(front[::2, ::2])}


@pytest.mark.parametrize("quality", [0, 90])
async def test_the_policy_sees_the_same_pixels_whoever_shrank_them(port: int, quality: int) -> None:
    policy = SeeingPolicy(cameras=POLICY)
    frames = robot_frames()
    sent: dict[bool, int] = {}
    async with running_server(server_manifest(port), policy=policy) as (_, ready):
        for state, downsize in enumerate((False, True), start=1):
            settings = client_settings(port)
            async with PolicyClient.connect(settings, f"robot-{state}", jpeg_quality=quality, downsize=downsize) as c:
                session = await open_on(c, ready, features=robot_features(policy))
                assert session.ack is not None
                # The ack offers each camera at the policy's size (it was declared larger).
                assert {n: (cam.height, cam.width) for n, cam in session.ack.input_sizes.items()} == POLICY
                await session.infer(np.full(6, float(state), np.float32), frames, timeout=10)
                sent[downsize] = sum(session.codec_status().bytes.values())
                await session.close()
    assert 0 < sent[True] * 10 < sent[False], sent  # 5x and 2.5x smaller in each dimension
    full, shrunk = policy.seen[1], policy.seen[2]
    for name in POLICY:
        assert full[name].shape == shrunk[name].shape == (*POLICY[name], 3)
        if quality == 0:
            # Parity: the server's shrink of the full frame is, byte for byte, the client's.
            np.testing.assert_array_equal(full[name], shrunk[name])
        else:
            # JPEG of a shrunk frame against a shrunk JPEG: the same picture, not the same bytes.
            diff = np.abs(full[name].astype(int) - shrunk[name].astype(int))
            assert diff.mean() < 4, diff.mean()


async def test_a_camera_declared_at_the_policy_size_is_not_offered_smaller(port: int) -> None:
    policy = SeeingPolicy(cameras=POLICY)
    async with (
        running_server(server_manifest(port), policy=policy) as (_, ready),
        PolicyClient.connect(client_settings(port), "robot") as client,
    ):
        session = await open_on(client, ready)  # the policy's own features: nothing to shrink
        assert session.ack is not None
        assert session.ack.input_sizes == {}
        await session.close()
