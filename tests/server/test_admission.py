"""Which frame sizes a session's observations may have: the declared one, or the policy's input size."""

from __future__ import annotations

import numpy as np
import pytest

from servo.server.admission import ImageGate, input_sizes
from servo.wire import (
    CameraFeature,
    EncodedImage,
    Features,
    Observation,
    WireError,
    encode,
    encode_image,
    encode_tensor,
)

POLICY = Features(["j"], ["j"], {"front": CameraFeature(96, 128), "wrist": CameraFeature(96, 128)})


@pytest.mark.parametrize(
    ("declared", "offered"),
    [
        ({"front": (480, 640), "wrist": (96, 128)}, {"front": (96, 128)}),  # equal: nothing to shrink
        ({"front": (96, 640), "wrist": (240, 320)}, {"front": (96, 128), "wrist": (96, 128)}),
        ({"front": (80, 640), "wrist": (240, 100)}, {}),  # smaller in one dimension: never grown
    ],
)
def test_the_policy_size_is_offered_for_cameras_declared_larger(
    declared: dict[str, tuple[int, int]], offered: dict[str, tuple[int, int]]
) -> None:
    assert input_sizes(declared, POLICY) == offered


def body(frames: dict[str, EncodedImage]) -> bytes:
    return encode(Observation(state=encode_tensor(np.zeros(1, np.float32)), images=frames))


def frame(h: int, w: int, quality: int = 0) -> EncodedImage:
    return encode_image(np.zeros((h, w, 3), np.uint8), quality)


def test_the_gate_takes_the_declared_or_the_offered_size_and_nothing_else() -> None:
    gate = ImageGate({"front": (480, 640)}, max_bytes=1 << 24, smaller={"front": (96, 128)})
    gate.check(body({"front": frame(480, 640)}))
    gate.check(body({"front": frame(96, 128, 90)}))
    with pytest.raises(WireError, match=r"size 120x160, the session declared 480x640 \(or 96x128\)"):
        gate.check(body({"front": frame(120, 160)}))
    lying = frame(96, 128, 90)
    with pytest.raises(WireError, match="JPEG header says 96x128, the message declares 480x640"):
        gate.check(body({"front": EncodedImage("jpeg", 480, 640, lying.data)}))
