"""``model.frames``: frames decoded onto the policy's device, served end to end through the CPU twin."""

from __future__ import annotations

import numpy as np
import pytest

from servo.policy import DecodedObservation, Prepared
from servo.policy.frames import DeviceFrameDecoder
from servo.policy.reference import ReferencePolicy, RelativeProcessor
from servo.policy.runner import InferenceRunner, synthetic_observation
from servo.server.decoding import device_frames_for
from servo.server.manifest import parse_manifest
from servo.wire.image import decode_image, encode_image
from tests.server.helpers import connected, open_on
from tests.server.policies import FixedComputePolicy
from tests.support import camera_frames, running_server

pytestmark = pytest.mark.anyio
pytest.importorskip("torchvision")

SMALL = {"front": (48, 64), "wrist": (48, 64)}


class FrameProbe(ReferencePolicy):
    """The reference policy, recording the type of every frame its processors were given."""

    def __init__(self) -> None:
        super().__init__(cameras=SMALL)
        self.frame_types: set[str] = set()

    def make_processor(self) -> RelativeProcessor:
        probe = self

        class Probing(RelativeProcessor):
            def preprocess(self, obs: DecodedObservation) -> Prepared:
                probe.frame_types.update(type(frame).__name__ for frame in obs.images.values())
                return super().preprocess(obs)

        return Probing(tuple(SMALL), "cpu")


def test_auto_decodes_onto_the_device_only_on_cuda_for_a_policy_that_takes_device_frames() -> None:
    reference, plain = ReferencePolicy(cameras=SMALL), FixedComputePolicy()
    assert device_frames_for("host", "cuda", reference.spec) is None
    assert device_frames_for("auto", "cpu", reference.spec) is None
    assert device_frames_for("auto", "cuda:0", plain.spec) is None  # its processor wants numpy frames
    assert isinstance(device_frames_for("device", "cpu", reference.spec), DeviceFrameDecoder)  # the CPU twin


@pytest.mark.parametrize("quality", [0, 90], ids=["raw", "jpeg90"])
async def test_a_server_decoding_onto_the_device_serves_the_host_paths_chunks(port: int, quality: int) -> None:
    manifest = parse_manifest(
        f"""
[model]
source = "reference"
warmup = 1
frames = "device"
process = "inline"
cuda_graphs = true
[model.options]
cameras = {{front = [48, 64], wrist = [48, 64]}}
[zenoh]
listen = ["tcp/127.0.0.1:{port}"]
[ops]
health_port = 0
"""
    )
    local = ReferencePolicy(cameras=SMALL)  # same seed, host frames, no graphs: the expected chunks
    runner = InferenceRunner(local)
    served = FrameProbe()
    async with (
        running_server(manifest, policy=served) as (_, ready),
        connected(port, "robot", jpeg_quality=quality) as client,
    ):
        served.frame_types.clear()  # the warm-up's synthetic frames are host arrays
        session = await open_on(client, ready)
        for seed in range(3):
            frames = camera_frames(48, 64, seed=seed)
            state = np.full(6, float(seed), np.float32)
            result = await session.infer(state, frames, timeout=10)
            obs = synthetic_observation(local)
            obs.state = state
            obs.images = (
                frames if quality == 0 else {k: decode_image(encode_image(v, quality)) for k, v in frames.items()}
            )
            expected = runner.infer(local.make_processor(), obs, 0)[1]
            np.testing.assert_allclose(result.chunk_robot, expected, atol=1e-5)
        await session.close()
    assert served.frame_types == {"Tensor"}  # decoded onto the device, not as numpy arrays
