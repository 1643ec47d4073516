"""Recorder + servo.recording: what the edge executed reads back, with provenance."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from servo._core import Provenance
from servo.edge.channel import Tick
from servo.edge.recorder import Recorder
from servo.recording import MAGIC, iter_records, read_recording
from servo.robots.protocol import CameraSpec, RobotSpec
from servo.wire import WireError, decode_image

SPEC = RobotSpec(
    name="test",
    fps=30.0,
    joint_names=("a.pos", "b.pos"),
    cameras={"front": CameraSpec(24, 32)},
    lower=(-1.0, -1.0),
    upper=(1.0, 1.0),
    max_velocity=(1.0, 1.0),
    rest_pose=(0.0, 0.0),
)

SESSION = "09" * 16


SESSION = "9a" * 16


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def write_episode(path: Path, *, image_every: int = 0) -> list[Tick]:
    frame = np.zeros((24, 32, 3), np.uint8)
    frame[:, :, 0] = 200  # red: the RGB order must survive
    ticks = [
        Tick(0, 100, f32(0, 0), None, "none", None, {"front": frame}),
        Tick(1, 200, f32(0, 0.1), f32(0.1, 0.2), "policy", Provenance(SESSION, 1, 0, 50, 1), {"front": frame}),
        Tick(2, 300, f32(0.1, 0.2), f32(0.2, 0.3), "policy", Provenance(SESSION, 1, 0, 50, 2), None),
        Tick(3, 400, f32(0.2, 0.3), f32(0.2, 0.3), "fallback", None, {"front": frame}),
        Tick(4, 500, f32(0.2, 0.3), f32(0.3, 0.4), "policy", Provenance(SESSION, 2, 1, 350, 3), None),
        Tick(5, 600, f32(0.3, 0.4), f32(0.0, 0.0), "park", None, None),
    ]
    recorder = Recorder(path, SPEC, client_id="arm-1", task="sweep", image_every=image_every)
    recorder.start()
    for tick in ticks:
        recorder.record(tick)
    recorder.close()
    assert recorder.written == len(ticks)
    assert recorder.dropped == 0
    return ticks


def test_round_trip_with_provenance(tmp_path: Path) -> None:
    path = tmp_path / "ep.servo"
    ticks = write_episode(path)
    assert path.read_bytes()[: len(MAGIC)] == MAGIC
    rec = read_recording(path)
    assert rec.header.robot == "test"
    assert rec.header.fps == 30.0
    assert rec.header.joint_names == ["a.pos", "b.pos"]
    assert (rec.header.client_id, rec.header.task) == ("arm-1", "sweep")
    assert rec.header.cameras == {"front": [24, 32]}
    assert [f.tick for f in rec.frames] == [t.tick for t in ticks]
    assert [f.source for f in rec.frames] == [t.source for t in ticks]
    for frame, tick in zip(rec.frames, ticks, strict=True):
        assert frame.mono_ns == tick.mono_ns
        if tick.source == "policy":
            assert tick.provenance is not None
            assert frame.provenance == tuple(tick.provenance)[:4]
            assert frame.step == tick.provenance.step
        else:
            assert frame.provenance is None
            assert frame.step is None
        assert frame.images == {}  # image_every=0: no frames recorded
    np.testing.assert_array_equal(rec.states(), np.vstack([t.state for t in ticks]))
    # actions(): ticks without an action repeat the previous one; none before the first
    expected = [t.action for t in ticks if t.action is not None]
    np.testing.assert_array_equal(rec.actions(), np.vstack(expected))


def test_images_every_n_ticks(tmp_path: Path) -> None:
    path = tmp_path / "ep.servo"
    write_episode(path, image_every=3)
    rec = read_recording(path)
    with_images = [f.tick for f in rec.frames if f.images]
    assert with_images == [0, 3]  # tick 0 and 3 had frames and are multiples of 3
    image = decode_image(rec.frames[0].images["front"])
    assert image.shape == (24, 32, 3)
    assert int(image[..., 0].mean()) > 180
    assert int(image[..., 2].mean()) < 40


def test_truncated_file_is_tolerated(tmp_path: Path) -> None:
    path = tmp_path / "ep.servo"
    write_episode(path)
    data = path.read_bytes()
    path.write_bytes(data[:-3])  # the writer died in the middle of the last record's body
    rec = read_recording(path)
    assert [f.tick for f in rec.frames] == [0, 1, 2, 3, 4]
    last = _record_offsets(data)[-1]
    path.write_bytes(data[: last + 2])  # ... or in the middle of its length prefix
    assert len(list(iter_records(path))) == 1 + 5


def _record_offsets(data: bytes) -> list[int]:
    offsets, at = [], len(MAGIC)
    while at < len(data):
        offsets.append(at)
        at += 4 + struct.unpack_from("<I", data, at)[0]
    return offsets


def test_bad_magic_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ep.servo"
    write_episode(path)
    path.write_bytes(b"NOTSERVO" + path.read_bytes()[len(MAGIC) :])
    with pytest.raises(WireError, match="bad magic"):
        read_recording(path)


def test_header_only_and_empty(tmp_path: Path) -> None:
    path = tmp_path / "ep.servo"
    recorder = Recorder(path, SPEC)
    recorder.start()
    recorder.close()
    assert read_recording(path).frames == []
    path.write_bytes(MAGIC)
    with pytest.raises(WireError, match="no header"):
        read_recording(path)


def test_corrupt_record(tmp_path: Path) -> None:
    path = tmp_path / "ep.servo"
    write_episode(path)
    data = bytearray(path.read_bytes())
    data[-5:] = b"\xc1\xc1\xc1\xc1\xc1"  # 0xc1 is never valid msgpack
    path.write_bytes(bytes(data))
    with pytest.raises(WireError, match="corrupt record"):
        read_recording(path)


def test_invalid_utf8_in_a_record_is_a_corrupt_record(tmp_path: Path) -> None:
    path = tmp_path / "ep.servo"
    write_episode(path)
    data = path.read_bytes().replace(b"\xa4test", b"\xa4\xff\xfe\xfd\xfc", 1)  # the robot's name
    path.write_bytes(data)
    with pytest.raises(WireError, match="corrupt record"):
        read_recording(path)
