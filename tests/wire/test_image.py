import threading

import numpy as np
import pytest

from servo.wire import EncodedImage, WireError, decode, decode_image, downsize, encode, encode_image


def solid(rgb: tuple[int, int, int], h: int = 48, w: int = 64) -> np.ndarray:
    frame = np.zeros((h, w, 3), dtype=np.uint8)
    frame[:] = rgb
    return frame


@pytest.mark.parametrize("quality", [0, 90])
@pytest.mark.parametrize("rgb", [(255, 0, 0), (0, 255, 0), (0, 0, 255)])
def test_rgb_channel_order_survives_round_trip(quality: int, rgb: tuple[int, int, int]) -> None:
    # A silent BGR swap would poison every policy in the fleet: a red image must stay red.
    wire = decode(encode(encode_image(solid(rgb), quality)), EncodedImage)
    back = decode_image(wire).astype(int)
    dominant = int(np.argmax(back.reshape(-1, 3).mean(axis=0)))
    assert dominant == int(np.argmax(rgb))
    assert np.abs(back - np.array(rgb)).max() <= 8


def test_raw_is_exact_and_zero_copy() -> None:
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, size=(30, 40, 3), dtype=np.uint8)
    buf = encode(encode_image(frame, 0))
    back = decode_image(decode(buf, EncodedImage))
    np.testing.assert_array_equal(back, frame)
    assert not back.flags.owndata


def test_jpeg_quality_changes_size() -> None:
    rng = np.random.default_rng(1)
    frame = np.clip(rng.normal(128, 40, size=(120, 160, 3)), 0, 255).astype(np.uint8)
    assert len(encode_image(frame, 30).data) < len(encode_image(frame, 95).data)


@pytest.mark.parametrize(
    ("image", "message"),
    [
        (EncodedImage("raw", 4, 4, memoryview(b"\0" * 10)), "raw frame has 10 bytes, expected 48"),
        (EncodedImage("jpeg", 4, 4, memoryview(b"\xff\xd8not a jpeg")), "corrupt JPEG"),
        (EncodedImage("raw", 0, 4, memoryview(b"")), "outside"),
        (EncodedImage("raw", 100_000, 100_000, memoryview(b"")), "outside"),
    ],
)
def test_bad_images_are_refused(image: EncodedImage, message: str) -> None:
    with pytest.raises(WireError, match=message):
        decode_image(image)


def test_jpeg_with_lying_header_is_refused_before_decoding() -> None:
    real = encode_image(solid((1, 2, 3), 16, 16), 90)
    liar = EncodedImage("jpeg", 8, 8, real.data)
    with pytest.raises(WireError, match="JPEG is 16x16 but the message declares 8x8"):
        decode_image(liar)


def test_expected_shape_is_checked() -> None:
    with pytest.raises(WireError, match="size is 48x64, expected 480x640"):
        decode_image(encode_image(solid((0, 0, 0)), 0), shape=(480, 640))


def test_bad_input_frames_are_refused() -> None:
    with pytest.raises(WireError, match="uint8"):
        encode_image(np.zeros((4, 4, 3), dtype=np.float32), 90)
    with pytest.raises(WireError, match="quality"):
        encode_image(solid((0, 0, 0)), 101)


def test_jpeg_codec_releases_the_gil() -> None:
    # A spinner thread counts while the main thread sits inside encode/decode. A codec holding
    # the GIL would freeze the spinner for the whole call (advance 0); a releasing one lets it
    # run whenever the OS schedules it. Large frames (tens of ms per call) and a majority vote
    # keep a loaded CI machine, which may not schedule the spinner in some calls, from failing.
    frame = np.random.default_rng(2).integers(0, 256, size=(1440, 1920, 3), dtype=np.uint8)
    jpeg = encode_image(frame, 90)
    stop = threading.Event()
    count = [0]

    def spin() -> None:
        while not stop.is_set():
            count[0] += 1

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        encode_advance, decode_advance = [], []
        for _ in range(7):
            before = count[0]
            encode_image(frame, 90)
            encode_advance.append(count[0] - before)
            before = count[0]
            decode_image(jpeg)
            decode_advance.append(count[0] - before)
    finally:
        stop.set()
        spinner.join(5)
    assert sum(a > 0 for a in encode_advance) >= 4, encode_advance
    assert sum(a > 0 for a in decode_advance) >= 4, decode_advance


def _camera_like(h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([x * 255 / w, y * 255 / h, 128 + 100 * np.sin(x / 23) * np.cos(y / 17)], axis=-1)
    noise = np.random.default_rng(2).normal(0, 3, size=base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def _area_resize(frame: np.ndarray, factor: int) -> np.ndarray:
    h, w = frame.shape[0] // factor, frame.shape[1] // factor
    return frame.reshape(h, factor, w, factor, 3).astype(np.float64).mean(axis=(1, 3))


@pytest.mark.parametrize("factor", [2, 4])
def test_a_policy_input_half_the_frame_or_less_is_decoded_scaled(factor: int) -> None:
    frame = _camera_like(480, 640)
    target = (480 // factor, 640 // factor)
    image = encode_image(frame, 90)
    scaled = decode_image(image, target=target)
    assert scaled.shape == (*target, 3)
    assert not scaled.flags.writeable
    reference = _area_resize(decode_image(image), factor)  # full decode, then resize
    difference = np.abs(scaled.astype(np.float64) - reference)
    assert difference.mean() < 2.0
    assert np.percentile(difference, 99) < 12


def test_scaled_decode_covers_a_target_that_is_no_scale_factor() -> None:
    # 224x224 from 480x640: libjpeg-turbo's 1/2 is the smallest scale that still covers it.
    image = encode_image(_camera_like(480, 640), 90)
    assert decode_image(image, target=(224, 224)).shape == (240, 320, 3)


@pytest.mark.parametrize("target", [(300, 400), (480, 640), (240, 400), None])
def test_more_than_half_the_frame_is_decoded_in_full(target: tuple[int, int] | None) -> None:
    image = encode_image(_camera_like(480, 640), 90)
    assert decode_image(image, target=target).shape == (480, 640, 3)


def test_raw_frames_are_never_resized() -> None:
    frame = _camera_like(96, 128)
    np.testing.assert_array_equal(decode_image(encode_image(frame, 0), target=(24, 32)), frame)


def area_mean(frame: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The definition, pixel by pixel: the mean of each output's window, rounded half up."""
    (height, width), (h, w) = frame.shape[:2], size
    out = np.empty((h, w, frame.shape[2]), np.uint8)
    for i in range(h):
        r0, r1 = i * height // h, -(-(i + 1) * height // h)
        for j in range(w):
            c0, c1 = j * width // w, -(-(j + 1) * width // w)
            window = frame[r0:r1, c0:c1].astype(np.int64)
            count = window.shape[0] * window.shape[1]
            out[i, j] = (window.sum(axis=(0, 1)) + count // 2) // count
    return out


@pytest.mark.parametrize("size", [(12, 16), (7, 9), (24, 32), (1, 1), (59, 79)])
def test_downsize_is_the_area_mean_of_each_window(size: tuple[int, int]) -> None:
    frame = np.random.default_rng(3).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    np.testing.assert_array_equal(downsize(frame, size), area_mean(frame, size))


def test_downsize_keeps_a_frame_of_the_size_and_refuses_to_grow() -> None:
    frame = np.zeros((24, 32, 3), np.uint8)
    assert downsize(frame, (24, 32)) is frame
    for size in [(25, 32), (24, 33), (0, 10)]:
        with pytest.raises(WireError, match="cannot shrink a 24x32 frame to"):
            downsize(frame, size)


def test_downsize_of_the_largest_frame_does_not_overflow() -> None:
    frame = np.full((4096, 4096, 3), 255, np.uint8)
    np.testing.assert_array_equal(downsize(frame, (1, 1)), np.full((1, 1, 3), 255, np.uint8))
