from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from servo.robots.cameras import CameraError, CameraGroup, OpenCVCamera, import_cv2
from servo.robots.capture import CaptureThread, LatestFrame
from servo.robots.protocol import Frame
from tests.support import new_threads


def frame(value: int) -> Frame:
    return np.full((4, 6, 3), value, dtype=np.uint8)


class Owner:
    """Stands in for a camera or robot object owning a capture thread."""


def test_latest_frame_slot() -> None:
    slot = LatestFrame()
    assert slot.latest() is None
    assert slot.wait(0, timeout_s=0.01) is None
    first = frame(1)
    slot.publish(first)
    assert slot.latest() is first
    assert not first.flags.writeable
    assert slot.seq == 1
    assert slot.wait(0, timeout_s=0.01) is first


def test_capture_thread_publishes_and_stops() -> None:
    slot = LatestFrame()
    counter = iter(range(10**9))
    owner = Owner()
    thread = CaptureThread("test", lambda: frame(next(counter) % 256), slot, owner=owner, period_s=0.001)
    thread.start()
    assert slot.wait(3, timeout_s=1.0) is not None
    assert thread.stop()
    assert not thread.is_alive
    seq = slot.seq
    assert slot.wait(seq, timeout_s=0.02) is None  # nothing published after stop


def test_capture_thread_survives_failing_grabs() -> None:
    calls = iter(range(10**9))
    released = threading.Event()

    def flaky() -> Frame | None:
        n = next(calls)
        if n == 0:
            raise OSError("usb hiccup")
        return None if n < 3 else frame(n % 256)

    slot = LatestFrame()
    owner = Owner()
    thread = CaptureThread("flaky", flaky, slot, owner=owner, on_exit=released.set)
    thread.start()
    assert slot.wait(0, timeout_s=1.0) is not None
    thread.stop()
    assert released.is_set()


def test_capture_thread_ends_when_owner_is_collected() -> None:
    owner = Owner()
    thread = CaptureThread("orphan", lambda: frame(0), LatestFrame(), owner=owner, period_s=0.01)
    thread.start()
    assert thread.is_alive
    del owner
    gc.collect()
    assert thread.join(timeout_s=1.0)


def test_missing_opencv_explains_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cv2", None)  # makes `import cv2` raise ImportError
    with pytest.raises(CameraError, match=r"pip install 'servo-robotics\[cameras\]'"):
        import_cv2()
    with pytest.raises(CameraError, match=r"pip install 'servo-robotics\[cameras\]'"):
        OpenCVCamera(0).connect()


def _red_video(path: Path, width: int = 64, height: int = 48) -> Path:
    cv2 = pytest.importorskip("cv2")
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30, (width, height))
    if not writer.isOpened():
        pytest.skip("this OpenCV build cannot write MJPG")
    bgr = np.zeros((height, width, 3), dtype=np.uint8)
    bgr[..., 2] = 220  # red, in OpenCV's BGR order
    for _ in range(3):
        writer.write(bgr)
    writer.release()
    return path


def test_opencv_camera_delivers_rgb_frames(tmp_path: Path) -> None:
    video = _red_video(tmp_path / "red.avi")
    before = set(threading.enumerate())
    camera = OpenCVCamera(str(video), width=64, height=48, fps=100.0, name="file")
    assert camera.latest() is None
    camera.connect()
    try:
        latest = camera.latest()
        assert latest is not None
        assert latest.shape == (48, 64, 3)
        red, green, blue = latest.reshape(-1, 3).mean(axis=0)
        assert red > 180 > 40 > max(green, blue)
        # The file loops, so it keeps standing in for a live camera past its three frames.
        for _ in range(5):
            assert camera.wait_for_frame(timeout_s=1.0) is not None
    finally:
        camera.disconnect()
        camera.disconnect()
    assert new_threads(before) == []


def test_opencv_camera_with_wrong_size_fails_clearly(tmp_path: Path) -> None:
    video = _red_video(tmp_path / "red.avi")
    before = set(threading.enumerate())
    camera = OpenCVCamera(str(video), width=640, height=480, name="file")
    with pytest.raises(CameraError, match=r"frames are \(48, 64, 3\), expected \(480, 640, 3\)"):
        camera.connect()
    assert new_threads(before) == []


def test_opencv_camera_that_does_not_open(tmp_path: Path) -> None:
    pytest.importorskip("cv2")
    with pytest.raises(CameraError, match="cannot open"):
        OpenCVCamera(str(tmp_path / "no-such-device")).connect()


def test_camera_group_connects_all_or_none(tmp_path: Path) -> None:
    video = _red_video(tmp_path / "red.avi")
    before = set(threading.enumerate())
    group = CameraGroup({"a": OpenCVCamera(str(video), 64, 48, 100.0, name="a"), "b": OpenCVCamera(str(video), 64, 48)})
    group.connect()
    try:
        assert {name: frame.shape for name, frame in group.read_cameras().items()} == {
            "a": (48, 64, 3),
            "b": (48, 64, 3),
        }
    finally:
        group.disconnect()
    assert new_threads(before) == []
    broken = CameraGroup({"a": OpenCVCamera(str(video), 64, 48), "b": OpenCVCamera(str(tmp_path / "none"))})
    with pytest.raises(CameraError, match="cannot open"):
        broken.connect()
    assert new_threads(before) == []  # the camera that had opened was released again


FORGOTTEN_CAMERA = """
import sys, threading, time
import numpy as np
from servo.robots.capture import CaptureThread, LatestFrame

class Camera:
    pass

camera, slot, stalled, stuck = Camera(), LatestFrame(), sys.argv[1] == "stalled", threading.Event()

def grab():
    if stalled and slot.seq:
        stuck.set()
        threading.Event().wait()  # a USB read that never returns
    return np.zeros((4, 6, 3), np.uint8)

thread = CaptureThread("front", grab, slot, owner=camera, period_s=0.001, on_exit=lambda: print("released"))
thread.start()
slot.wait(0, timeout_s=30)
if stalled:
    stuck.wait(30)
print(time.monotonic(), flush=True)  # never stopped: the interpreter's exit must end it
"""


@pytest.mark.parametrize("grab", ["paced", "stalled"])
def test_a_camera_never_stopped_does_not_keep_the_process_alive(grab: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FORGOTTEN_CAMERA), grab], capture_output=True, text=True, timeout=60
    )
    ended = time.monotonic()
    lines = proc.stdout.split()
    assert proc.returncode == 0, proc.stderr
    # A loop that can end releases its device at exit; a stalled grab is abandoned, not joined.
    assert lines[1:] == (["released"] if grab == "paced" else [])
    assert ended - float(lines[0]) < 1.0
