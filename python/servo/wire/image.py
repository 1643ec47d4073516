"""Camera frames on the wire: JPEG through libjpeg-turbo (simplejpeg), or raw RGB.

Both directions release the GIL inside libjpeg-turbo, so a network worker can encode while the
control loop keeps the interpreter.
"""

from __future__ import annotations

from typing import Literal

import msgspec
import numpy as np
import numpy.typing as npt
import simplejpeg

from servo.wire.errors import WireError

Frame = npt.NDArray[np.uint8]

#: Larger frames are refused before any decompression happens (8K x 8K).
MAX_IMAGE_PIXELS = 8192 * 8192


class EncodedImage(msgspec.Struct, frozen=True):
    """One RGB frame: ``codec="jpeg"`` bytes, or ``codec="raw"`` H*W*3 uint8 bytes."""

    codec: Literal["jpeg", "raw"]
    height: int
    width: int
    data: memoryview


def check_frame(frame: object, *, what: str = "image") -> None:
    """Refuse anything but an RGB uint8 array of shape (H, W, 3), saying what it is instead.

    Raises:
        WireError: e.g. ``camera 'front': expected uint8 (H, W, 3) RGB, got float32 (3, 480, 640)
            (channels first? use frame.transpose(1, 2, 0))``.
    """
    if not isinstance(frame, np.ndarray):
        raise WireError(f"{what}: expected a numpy uint8 (H, W, 3) RGB array, got {type(frame).__name__}")
    if frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3 and frame.shape[0] and frame.shape[1]:
        return
    hint = ""
    if frame.ndim == 3 and frame.shape[0] == 3 and frame.shape[2] != 3:
        hint = " (channels first? use frame.transpose(1, 2, 0))"
    elif frame.dtype != np.uint8 and np.issubdtype(frame.dtype, np.floating):
        hint = " (floats? convert to 0..255 uint8)"
    raise WireError(f"{what}: expected uint8 (H, W, 3) RGB, got {frame.dtype} {tuple(frame.shape)}{hint}")


def encode_image(frame: Frame, quality: int) -> EncodedImage:
    """Encode an RGB uint8 frame of shape (H, W, 3).

    Args:
        frame: The frame, RGB channel order.
        quality: JPEG quality 1..100, or 0 to send the raw pixels (no copy when contiguous).
    """
    check_frame(frame)
    if not 0 <= quality <= 100:
        raise WireError(f"JPEG quality must be 0 (raw) or 1..100, got {quality}")
    height, width = int(frame.shape[0]), int(frame.shape[1])
    if quality == 0:
        raw = np.ascontiguousarray(frame)
        return EncodedImage("raw", height, width, raw.reshape(-1).data)
    jpeg = simplejpeg.encode_jpeg(
        np.ascontiguousarray(frame), quality=quality, colorspace="RGB", colorsubsampling="420"
    )
    return EncodedImage("jpeg", height, width, memoryview(jpeg))


def decode_image(
    image: EncodedImage,
    *,
    shape: tuple[int, int] | None = None,
    target: tuple[int, int] | None = None,
    max_pixels: int = MAX_IMAGE_PIXELS,
    what: str = "image",
) -> Frame:
    """Decode to an RGB uint8 (H, W, 3) array; raw frames are a read-only zero-copy view.

    Args:
        image: The wire struct.
        shape: If given, the (height, width) the frame must have.
        target: The (height, width) its consumer resizes the frame to. A JPEG at least twice
            that size in both dimensions is scaled down while it is decoded (in the DCT domain,
            cheaper than a full decode) to the smallest size libjpeg-turbo offers that still
            covers ``target``: exactly ``target`` when the frame is 2, 4 or 8 times as large.
        max_pixels: Refuse frames with more pixels than this.
        what: Name used in error messages (e.g. ``"images['front']"``).

    Raises:
        WireError: wrong declared or actual size, corrupt JPEG, unknown codec.
    """
    h, w = image.height, image.width
    if h <= 0 or w <= 0 or h * w > max_pixels:
        raise WireError(f"{what}: size {h}x{w} is outside 1..{max_pixels} pixels")
    if shape is not None and (h, w) != tuple(shape):
        raise WireError(f"{what}: size is {h}x{w}, expected {shape[0]}x{shape[1]}")
    if image.codec == "raw":
        if len(image.data) != h * w * 3:
            raise WireError(f"{what}: raw frame has {len(image.data)} bytes, expected {h * w * 3}")
        return np.frombuffer(image.data, dtype=np.uint8).reshape(h, w, 3)
    if image.codec != "jpeg":
        raise WireError(f"{what}: unknown codec {image.codec!r} (expected 'jpeg' or 'raw')")
    try:
        jh, jw, _, _ = simplejpeg.decode_jpeg_header(image.data)
        if (jh, jw) != (h, w):
            raise WireError(f"{what}: JPEG is {jh}x{jw} but the message declares {h}x{w}")
        frame: Frame = simplejpeg.decode_jpeg(image.data, colorspace="RGB", **_scaling(h, w, target))
        # Read-only like a raw frame: a policy must not depend on the codec the robot chose.
        frame.flags.writeable = False
    except ValueError as exc:
        if isinstance(exc, WireError):
            raise
        raise WireError(f"{what}: corrupt JPEG ({exc})") from exc
    return frame


def _scaling(height: int, width: int, target: tuple[int, int] | None) -> dict[str, int]:
    """Simplejpeg's scaled-decode arguments for a ``height`` x ``width`` JPEG ({} for a full decode)."""
    if target is None or 2 * target[0] > height or 2 * target[1] > width:
        return {}
    # min_factor 2: libjpeg-turbo's factors between 1 and 2 (e.g. 8/9) cost more than a full decode.
    return {"min_height": target[0], "min_width": target[1], "min_factor": 2}
