"""Camera frames on the wire: JPEG through libjpeg-turbo (simplejpeg), or raw RGB.

Both directions release the GIL inside libjpeg-turbo, so a network worker can encode while the
control loop keeps the interpreter.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
import numpy as np
import numpy.typing as npt
import simplejpeg

from servo.wire.errors import WireError

Frame = npt.NDArray[np.uint8]

#: Larger frames are refused before any decompression happens (8K x 8K). A server refuses far
#: smaller ones (its ``[limits]``, and the policy's own camera shapes) before decoding anything.
MAX_IMAGE_PIXELS = 8192 * 8192
#: Segments `jpeg_dimensions` walks before the frame header; encoders write about five (APPn,
#: DQT, SOF), so a stream of thousands of tiny segments is refused instead of walked.
MAX_JPEG_SEGMENTS = 64
#: Start-of-frame markers (every SOFn except DHT 0xC4, JPG 0xC8 and DAC 0xCC).
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_SOS, _EOI = 0xDA, 0xD9


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


def jpeg_dimensions(data: bytes | memoryview, *, what: str = "image") -> tuple[int, int]:
    """The (height, width) a JPEG's frame header declares, read without decompressing anything.

    Walks the marker segments from SOI to the first SOFn (at most `MAX_JPEG_SEGMENTS`); costs
    microseconds whatever the stream claims, so a decompression bomb is refused by its header.

    Raises:
        WireError: not a JPEG, truncated, no frame header before the scan, a height of 0 (defined
            later by a DNL marker: not accepted), or too many segments.
    """
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    if len(view) < 4 or view[0] != 0xFF or view[1] != 0xD8:
        raise WireError(f"{what}: not a JPEG (no SOI marker)")
    pos = 2
    for _ in range(MAX_JPEG_SEGMENTS):
        while pos < len(view) and view[pos] == 0xFF and pos + 1 < len(view) and view[pos + 1] == 0xFF:
            pos += 1  # fill bytes before a marker
        if pos + 4 > len(view) or view[pos] != 0xFF:
            raise WireError(f"{what}: corrupt JPEG (no marker at byte {pos})")
        marker = view[pos + 1]
        length = (view[pos + 2] << 8) | view[pos + 3]
        if marker in (_SOS, _EOI):
            raise WireError(f"{what}: corrupt JPEG (no frame header before the scan)")
        if marker in _SOF_MARKERS:
            if length < 8 or pos + 9 > len(view):
                raise WireError(f"{what}: corrupt JPEG (truncated frame header)")
            height = (view[pos + 5] << 8) | view[pos + 6]
            width = (view[pos + 7] << 8) | view[pos + 8]
            if height == 0 or width == 0:
                raise WireError(f"{what}: JPEG frame header declares {height}x{width}")
            return height, width
        if length < 2:
            raise WireError(f"{what}: corrupt JPEG (segment length {length} at byte {pos})")
        pos += 2 + length
    raise WireError(f"{what}: JPEG has more than {MAX_JPEG_SEGMENTS} segments before its frame header")


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
    jh, jw = jpeg_dimensions(image.data, what=what)
    if (jh, jw) != (h, w):
        raise WireError(f"{what}: JPEG is {jh}x{jw} but the message declares {h}x{w}")
    try:
        frame: Frame = simplejpeg.decode_jpeg(image.data, colorspace="RGB", **_scaling(h, w, target))
        # Read-only like a raw frame: a policy must not depend on the codec the robot chose.
        frame.flags.writeable = False
    except ValueError as exc:
        if isinstance(exc, WireError):
            raise
        raise WireError(f"{what}: corrupt JPEG ({exc})") from exc
    return frame


def _scaling(height: int, width: int, target: tuple[int, int] | None) -> dict[str, int]:
    """The scaled-decode arguments of simplejpeg for a ``height`` x ``width`` JPEG ({} for a full decode)."""
    if target is None or 2 * target[0] > height or 2 * target[1] > width:
        return {}
    # min_factor 2: libjpeg-turbo's factors between 1 and 2 (e.g. 8/9) cost more than a full decode.
    return {"min_height": target[0], "min_width": target[1], "min_factor": 2}


def downsize(frame: Frame, size: tuple[int, int]) -> Frame:
    """``frame`` shrunk to ``size`` (height, width) by area averaging: the one resize of servo.

    Each output pixel is the mean of the input pixels its window covers (rows
    ``floor(i * H / h)`` to ``ceil((i + 1) * H / h)``, likewise for columns: torch's
    ``interpolate(mode="area")``, adaptive average pooling), rounded half up. Computed in
    integers, so a frame the edge shrinks before sending is, byte for byte, what the server makes
    of the full frame on any platform. A frame already of that size is returned as is.

    Raises:
        WireError: ``size`` is larger than the frame in either dimension (this only shrinks).
    """
    height, width = int(frame.shape[0]), int(frame.shape[1])
    h, w = size
    if (h, w) == (height, width):
        return frame
    if not (0 < h <= height and 0 < w <= width):
        raise WireError(f"cannot shrink a {height}x{width} frame to {h}x{w}")
    # uint32 holds 255 x 65535 rows; uint64 any window of a frame within MAX_IMAGE_PIXELS.
    rows = _window_sums(frame.reshape(height, -1), h, axis=0, dtype=np.uint32).reshape(h, width, -1)
    sums = _window_sums(rows, w, axis=1, dtype=np.uint64)
    count = (_window_lengths(height, h)[:, None] * _window_lengths(width, w)[None, :])[:, :, None]
    out: Frame = ((sums + count // 2) // count).astype(np.uint8)
    return out


def _windows(n_in: int, n_out: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Start and end (exclusive) of each output index's window over ``n_in`` inputs."""
    index = np.arange(n_out, dtype=np.int64)
    return (index * n_in) // n_out, -((-(index + 1) * n_in) // n_out)


def _window_lengths(n_in: int, n_out: int) -> npt.NDArray[np.uint64]:
    start, end = _windows(n_in, n_out)
    return (end - start).astype(np.uint64)


def _window_sums(
    a: npt.NDArray[Any], n_out: int, *, axis: int, dtype: type[np.unsignedinteger[Any]]
) -> npt.NDArray[Any]:
    """Sums of ``a`` over each output's window along ``axis``, in ``dtype``."""
    n_in = a.shape[axis]
    start, end = _windows(n_in, n_out)
    shape = list(a.shape)
    shape[axis] = n_out
    out = np.zeros(shape, dtype)
    mask_shape = [1] * a.ndim
    mask_shape[axis] = n_out
    shortest = int((end - start).min())
    # One gather per position in the window: every window has the first `shortest`; the rest
    # are masked out where a window is shorter.
    for k in range(int((end - start).max())):
        part = np.take(a, np.minimum(start + k, n_in - 1), axis=axis)
        if k >= shortest:
            part = part * (start + k < end).reshape(mask_shape)
        np.add(out, part, out=out)
    return out
