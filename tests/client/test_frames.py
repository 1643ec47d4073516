"""A wrong camera frame is one WireError naming the camera, whatever the JPEG setting."""

from __future__ import annotations

import numpy as np
import pytest

from servo.wire import WireError
from tests.server.helpers import connected, open_on, server_manifest
from tests.server.policies import FixedComputePolicy
from tests.support import running_server

pytestmark = pytest.mark.anyio

BAD_FRAMES = {
    "channels first": (np.zeros((3, 24, 32), np.uint8), "got uint8 (3, 24, 32) (channels first?"),
    "floats": (np.zeros((24, 32, 3), np.float32), "got float32 (24, 32, 3) (floats? convert to 0..255 uint8)"),
    "grey": (np.zeros((24, 32), np.uint8), "got uint8 (24, 32)"),
    "a list": ([[0]], "expected a numpy uint8 (H, W, 3) RGB array, got list"),
}


@pytest.mark.parametrize("quality", [0, 90])
async def test_bad_frames_name_the_camera(port: int, quality: int) -> None:
    policy = FixedComputePolicy(cameras={"front": (24, 32), "wrist": (24, 32)})
    async with (
        running_server(server_manifest(port), policy=policy) as (_, ready),
        connected(port, "robot", jpeg_quality=quality) as client,
    ):
        session = await open_on(client, ready)
        good = np.zeros((24, 32, 3), np.uint8)
        for frame, message in BAD_FRAMES.values():
            with pytest.raises(WireError) as info:
                await session.infer(np.zeros(6, np.float32), {"front": good, "wrist": frame}, timeout=5)
            assert str(info.value).startswith("camera 'wrist': expected"), str(info.value)
            assert message in str(info.value)
        # nothing was sent for the bad ones: the session still serves
        result = await session.infer(np.full(6, 2.0, np.float32), {"front": good, "wrist": good}, timeout=5)
        assert result.chunk_robot[0][0] == 2.0
        await session.close()
