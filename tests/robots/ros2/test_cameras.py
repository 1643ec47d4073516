"""ROS 2 cameras: Image (rgb8/bgr8, padded rows) and CompressedImage (JPEG) decoded to RGB, and read
from the simulated arm's topics on capture threads."""

from __future__ import annotations

import numpy as np
import pytest
import simplejpeg

from servo.robots import RobotDescription
from servo.robots.ros2.cameras import FrameError, decode
from servo.robots.ros2.messages import CompressedImage, Header, Image
from tests.robots.ros2.node import NoPoses, RosEnv

H, W = 4, 5


def rgb() -> np.ndarray:
    return np.arange(H * W * 3, dtype=np.uint8).reshape(H, W, 3)


def test_raw_rows_with_padding_and_either_channel_order() -> None:
    frame = rgb()
    step = 3 * W + 3  # rows padded to a multiple of 6 bytes, as some drivers do
    padded = np.zeros((H, step), np.uint8)
    padded[:, : 3 * W] = frame.reshape(H, 3 * W)
    as_rgb = decode(Image(Header(), H, W, "rgb8", 0, step, padded.tobytes()), H, W)
    np.testing.assert_array_equal(as_rgb, frame)
    bgr = np.ascontiguousarray(frame[..., ::-1])
    np.testing.assert_array_equal(decode(Image(Header(), H, W, "bgr8", 0, 3 * W, bgr.tobytes()), H, W), frame)


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        (Image(Header(), H, W, "mono8", 0, W, bytes(H * W)), "encoding 'mono8' is not rgb8 or bgr8"),
        (Image(Header(), H + 1, W, "rgb8", 0, 3 * W, bytes(3 * W * (H + 1))), "frame is 5x5, declared 5x4"),
        (Image(Header(), H, W, "rgb8", 0, 3 * W, bytes(3 * W * H - 1)), "cannot hold 5x4 rgb8"),
        (Image(Header(), H, W, "rgb8", 0, 2 * W, bytes(3 * W * H)), "cannot hold 5x4 rgb8"),
        (CompressedImage(Header(), "png", b"\x89PNG"), "only JPEG is decoded"),
        (CompressedImage(Header(), "jpeg", b"not a jpeg"), "not a JPEG"),
    ],
)
def test_what_cannot_be_a_frame_is_refused(message: Image | CompressedImage, problem: str) -> None:
    with pytest.raises(FrameError, match=problem):
        decode(message, H, W)


def test_jpeg_colours_follow_image_transports_format() -> None:
    frame = np.zeros((16, 16, 3), np.uint8)
    frame[..., 0] = 200  # red
    jpeg = simplejpeg.encode_jpeg(frame, quality=95, colorspace="RGB")
    red = decode(CompressedImage(Header(), "rgb8; jpeg compressed bgr8", jpeg), 16, 16)
    assert red[..., 0].mean() > 150 > red[..., 2].mean()
    # A JPEG made from rgb8 bytes taken for BGR has red and blue swapped: swapped back.
    swapped = decode(CompressedImage(Header(), "rgb8; jpeg compressed rgb8", jpeg), 16, 16)
    assert swapped[..., 2].mean() > 150 > swapped[..., 0].mean()


@pytest.mark.parametrize("topic", ["cam/image_raw", "cam/image_raw/compressed"])
def test_frames_from_the_arms_topics(ros_env: RosEnv, topic: str) -> None:
    camera = f"front:{topic}:64x48"
    nodes = [
        ros_env.start_node("--camera", camera),
        ros_env.start_node("--camera", f"front:{topic}_bgr:64x48", "--bgr"),
    ]
    try:
        frames = []
        for name in (topic, f"{topic}_bgr"):
            description = RobotDescription("ros2", ros_env.robot_options(cameras=f"front:{name}:64x48"))
            cameras = description.build_cameras(NoPoses())
            cameras.connect()
            try:
                frames.append(cameras.read_cameras()["front"])
            finally:
                cameras.disconnect()
    finally:
        for node in nodes:
            node.stop()
    for frame in frames:
        assert frame.shape == (48, 64, 3)
        assert frame.dtype == np.uint8
        # The arm renders red as a ramp across the image and blue as its complement.
        assert frame[:, -8:, 0].mean() > frame[:, :8, 0].mean()
        assert frame[:, :8, 2].mean() > frame[:, -8:, 2].mean()


def test_a_camera_without_frames_is_one_line_at_connect(ros_env: RosEnv) -> None:
    description = RobotDescription(
        "ros2", ros_env.robot_options(cameras="front:nothing_here:64x48", connect_timeout_s=0.5)
    )
    cameras = description.build_cameras(NoPoses())
    with pytest.raises(ConnectionError) as caught:
        cameras.connect()
    assert str(caught.value) == (
        f"ROS 2 robot: camera 'front' got no rgb8/bgr8 frame of 64x48 on {ros_env.namespace}/nothing_here within 0.5 s "
        f"(dds, domain {ros_env.domain_id}: is the camera publishing there, with this ROS_DOMAIN_ID?)"
    )
