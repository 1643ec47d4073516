"""Camera frames through the server's decoder: JPEG and raw, several cameras, RGB order kept."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest

from servo.client import PolicyClient
from servo.wire import CameraFeature
from tests.server.helpers import connected, open_on
from tests.server.policies import FixedComputePolicy
from tests.support import client_settings, make_manifest, running_server

pytestmark = pytest.mark.anyio

CAMERAS = {"front": (48, 64), "wrist": (24, 32), "top": (30, 40)}
COLORS = {"front": (200, 30, 30), "wrist": (30, 200, 30), "top": (30, 30, 200)}


class ColorProbe(FixedComputePolicy):
    """Records the mean RGB of every camera the processor was given (worker thread writes,
    the test reads after the server drained)."""

    def __init__(self) -> None:
        super().__init__(cameras=CAMERAS)
        self.seen: list[dict[str, tuple[np.ndarray, tuple[int, ...]]]] = []

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: Any) -> np.ndarray:
        images = batch["images"]
        self.seen.append({name: (img.reshape(-1, 3).mean(axis=0), img.shape) for name, img in images.items()})
        return super().predict_chunk(batch, inference_delay, prefix)


@pytest.mark.parametrize("quality", [0, 90], ids=["raw", "jpeg90"])
async def test_every_camera_arrives_decoded_in_rgb(port: int, quality: int) -> None:
    policy = ColorProbe()
    frames = {name: np.full((h, w, 3), COLORS[name], np.uint8) for name, (h, w) in CAMERAS.items()}
    async with running_server(make_manifest(port), policy=policy) as (_, ready):
        policy.seen.clear()
        async with connected(port, "robot", jpeg_quality=quality) as client:
            session = await open_on(client, ready)
            for _ in range(3):
                await session.infer(np.zeros(6, np.float32), frames, timeout=5)
            await session.close()
    assert len(policy.seen) == 3
    for seen in policy.seen:
        assert set(seen) == set(CAMERAS)
        for name, (mean, shape) in seen.items():
            assert shape == (*CAMERAS[name], 3)
            np.testing.assert_allclose(mean, COLORS[name], atol=3 if quality else 0)


@pytest.mark.parametrize("quality", [0, 90], ids=["raw", "jpeg90"])
async def test_frames_larger_than_the_policy_input_reach_it_at_its_size(port: int, quality: int) -> None:
    policy = ColorProbe()
    # Every camera sent at 2x (front: 4x) the size the policy declares.
    sent = {"front": (192, 256), "wrist": (48, 64), "top": (60, 80)}
    frames = {name: np.full((h, w, 3), COLORS[name], np.uint8) for name, (h, w) in sent.items()}
    async with running_server(make_manifest(port), policy=policy) as (_, ready):
        policy.seen.clear()
        # The server shrinks them: this client sends its frames as they are.
        settings = client_settings(port)
        async with PolicyClient.connect(settings, "robot", jpeg_quality=quality, downsize=False) as client:
            cameras = {name: CameraFeature(h, w) for name, (h, w) in sent.items()}
            features = msgspec.structs.replace(ready.info.features, cameras=cameras)
            session = await open_on(client, ready, features=features)  # declares the sizes it sends
            await session.infer(np.zeros(6, np.float32), frames, timeout=5)
            await session.close()
    (seen,) = policy.seen
    for name, (mean, shape) in seen.items():
        # JPEG: decoded scaled in the DCT domain, then shrunk to the policy's size like a raw frame
        # (`servo.wire.downsize`, the function the edge shrinks with).
        assert shape == (*CAMERAS[name], 3)
        np.testing.assert_allclose(mean, COLORS[name], atol=3 if quality else 0)
