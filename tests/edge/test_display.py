"""``servo-edge --display``: what reaches Rerun, read back from an .rrd file with Rerun's own reader."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg

from servo.config import ConfigError
from servo.edge.channel import Tick
from servo.edge.display import INBOX_BATCHES, Display, DisplayConfig
from servo.edge.stats import EngineStats
from servo.recording import read_recording
from servo.robots import SimCameraConfig, SimConfig, SimSO100
from servo.wire import decode_tensor
from tests.edge.harness import run_edge, start_server, write_manifest
from tests.edge.test_cli import error_lines, far_trajectory
from tests.support import free_port

pytest.importorskip("rerun")

SPEC = SimSO100(SimConfig(cameras=(SimCameraConfig("front", 48, 64),))).spec
JOINTS = SPEC.joint_names
FRAME = np.arange(48 * 64 * 3, dtype=np.uint8).reshape(48, 64, 3)


def read_rrd(path: Path) -> dict[str, dict[str, list[Any]]]:
    """Entity path -> column -> values (the tick timeline, and the components' first instance), in file order."""
    from rerun.chunk import RrdReader

    entities: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for chunk in RrdReader(path).stream().collect().stream():
        batch = chunk.to_record_batch()
        for name in batch.schema.names:
            if name == "tick":
                entities[chunk.entity_path][name].extend(batch.column(name).to_pylist())
            elif ":" in name and not name.startswith("rerun."):
                entities[chunk.entity_path][name].extend(row[0] for row in batch.column(name).to_pylist())
    return entities


def scalars(entities: dict[str, dict[str, list[Any]]], path: str) -> dict[int, float]:
    """A scalar series by tick."""
    columns = entities[path]
    return dict(zip(columns["tick"], columns["Scalars:scalars"], strict=True))


def stats(state: str, queue_depth: int = 0, delay_steps: int = 0, rtt_ms: float | None = None) -> EngineStats:
    return EngineStats(state, 0, 0, 0, 0, 0, 0, 0, 0, queue_depth, delay_steps, rtt_ms, rtt_ms)


def ticks(first: int, count: int, command_from: int) -> list[Tick]:
    out = []
    for tick in range(first, first + count):
        state = np.full(len(JOINTS), tick, np.float32) + np.arange(len(JOINTS), dtype=np.float32) / 10
        action = state + np.float32(0.5) if tick >= command_from else None
        out.append(Tick(tick, 1_000_000_000 + tick * 33_000_000, state, action, "policy", None))
    return out


class StillCameras:
    """Cameras that always show `FRAME` (any thread); ``gate`` can hold `read_cameras` back."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False

    def connect(self) -> None:
        pass

    def disconnect(self) -> None:
        pass

    def read_cameras(self) -> dict[str, np.ndarray]:
        self.entered.set()
        assert self.gate.wait(10)
        if self.fail:
            raise RuntimeError("camera unplugged")
        return {"front": FRAME}


def test_ticks_statistics_and_frames_reach_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run.rrd"
    display = Display(DisplayConfig(save=str(path)))
    display.start(SPEC, StillCameras())
    display.offer(ticks(0, 5, command_from=2), stats("connecting"))
    display.offer(ticks(5, 5, command_from=0), stats("streaming", queue_depth=12, delay_steps=3, rtt_ms=41.5))
    display.offer([], stats("degraded", queue_depth=4, delay_steps=3, rtt_ms=40.0))
    display.close()
    display.close()  # idempotent
    assert display.dropped == 0
    entities = read_rrd(path)
    for index, joint in enumerate(JOINTS):
        measured = scalars(entities, f"/joints/{joint}/measured")
        commanded = scalars(entities, f"/joints/{joint}/commanded")
        assert measured == pytest.approx({t: t + index / 10 for t in range(10)})
        assert commanded == pytest.approx({t: t + index / 10 + 0.5 for t in range(2, 10)})
    # Statistics sit at the newest tick of their drain; the state only when it changes.
    assert scalars(entities, "/engine/queue_depth") == {4: 0.0, 9: 4.0}
    assert scalars(entities, "/engine/rtt_ms") == {9: 40.0}
    assert entities["/engine/state"]["TextLog:text"] == ["connecting", "streaming", "degraded"]
    (blob,) = entities["/cameras/front"]["EncodedImage:blob"]
    assert entities["/cameras/front"]["EncodedImage:media_type"] == ["image/jpeg"]
    assert simplejpeg.decode_jpeg(bytes(blob)).shape == (48, 64, 3)


def test_offer_never_waits_for_a_lagging_display(tmp_path: Path) -> None:
    cameras = StillCameras()
    cameras.gate.clear()
    display = Display(DisplayConfig(save=str(tmp_path / "run.rrd")))
    display.start(SPEC, cameras)
    display.offer(ticks(0, 1, command_from=0), stats("streaming"))
    assert cameras.entered.wait(10)  # the display thread is stuck in the cameras now
    for first in range(1, INBOX_BATCHES + 6):
        display.offer(ticks(first, 1, command_from=0), stats("streaming"))
    assert display.dropped == 5
    cameras.gate.set()
    display.close()
    assert len(read_rrd(tmp_path / "run.rrd")[f"/joints/{JOINTS[0]}/measured"]["tick"]) == INBOX_BATCHES + 1


def test_a_display_error_stops_the_display_not_the_caller(tmp_path: Path) -> None:
    cameras = StillCameras()
    cameras.fail = True
    display = Display(DisplayConfig(save=str(tmp_path / "run.rrd")))
    display.start(SPEC, cameras)
    display.offer(ticks(0, 1, command_from=0), stats("streaming"))
    assert cameras.entered.wait(10)
    display.close()
    assert display.failure == "RuntimeError: camera unplugged"
    display.offer(ticks(1, 1, command_from=0), stats("streaming"))  # ignored, never raises


def test_a_file_in_a_missing_directory_is_refused_before_anything_starts(tmp_path: Path) -> None:
    display = Display(DisplayConfig(save=str(tmp_path / "nope" / "run.rrd")))
    with pytest.raises(ConfigError, match=r"^--display-save: directory '.*nope' does not exist$"):
        display.start(SPEC, StillCameras())


def test_the_edge_shows_what_it_records(tmp_path: Path) -> None:
    """End to end through servo-edge and its control process: the view is the recording. Every file
    the run writes is this user's alone, whatever the umask (the view and the summary took 0644)."""
    replay = far_trajectory(tmp_path / "far.servo")
    record, view, summary = tmp_path / "out.servo", tmp_path / "run.rrd", tmp_path / "run.json"
    previous = os.umask(0o022)
    try:
        result = run_edge(
            f"--robot sim --robot-opt cameras=front:64x48 --replay {replay} --record {record} "
            f"--display-save {view} --summary {summary} --log-level warning"
        )
    finally:
        os.umask(previous)
    assert result.returncode == 0, result.stderr
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in (record, view, summary)} == dict.fromkeys(
        ("out.servo", "run.rrd", "run.json"), 0o600
    )
    frames = read_recording(record).frames
    assert len(frames) == json.loads(summary.read_text())["ticks"] > 30
    entities = read_rrd(view)
    for index, joint in enumerate(JOINTS):
        measured = scalars(entities, f"/joints/{joint}/measured")
        commanded = scalars(entities, f"/joints/{joint}/commanded")
        assert measured == pytest.approx({f.tick: float(decode_tensor(f.state)[index]) for f in frames})
        sent = {f.tick: float(decode_tensor(f.action)[index]) for f in frames if f.action is not None}
        assert sent
        assert commanded == pytest.approx(sent)
    assert "streaming" in entities["/engine/state"]["TextLog:text"]
    assert entities["/cameras/front"]["EncodedImage:blob"]


def test_without_rerun_the_edge_says_how_to_install_it(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['rerun'] = None\n"  # what an edge without the extra sees
        "import servo.cli.edge, servo.edge.runtime\n"
        "assert sys.modules['rerun'] is None\n"
        "sys.exit(servo.cli.edge.main(sys.argv[1:]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "--robot", "sim", "--display-save", str(tmp_path / "run.rrd")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "servo-edge: error: --display needs Rerun, which is not installed: pip install 'servo-robotics[rerun]'"
    )


def test_display_flags_are_checked_like_options() -> None:
    result = run_edge("--robot sim --display-save x.rrd --display-camera-fps 0")
    assert result.returncode == 2
    (line,) = error_lines(result.stderr)
    assert line == "servo-edge: error: --display: camera_fps = '0': expected float > 0.0"


@pytest.mark.slow
def test_against_a_server_the_view_has_the_round_trip_and_the_delay(tmp_path: Path) -> None:
    port = free_port()
    server = start_server(write_manifest(tmp_path / "manifest.toml", port))
    view = tmp_path / "run.rrd"
    try:
        result = run_edge(
            f"--robot sim --robot-opt cameras=front:64x48 --connect tcp/127.0.0.1:{port} --duration 3 "
            f"--display-save {view} --log-level warning"
        )
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr
    entities = read_rrd(view)
    assert entities["/engine/state"]["TextLog:text"][-1] == "streaming"
    assert all(0 < rtt < 1000 for rtt in scalars(entities, "/engine/rtt_ms").values())
    assert max(scalars(entities, "/engine/queue_depth").values()) > 0
    assert "/engine/delay_steps" in entities
    assert len(entities["/cameras/front"]["EncodedImage:blob"]) >= 3  # ~5 a second for 3 s


@pytest.mark.skipif(sys.platform != "linux", reason="DISPLAY / WAYLAND_DISPLAY say whether Linux has a screen")
def test_display_on_a_machine_without_a_screen_says_what_to_use_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    display = Display(DisplayConfig(spawn=True, save=str(tmp_path / "run.rrd")))
    with pytest.raises(
        ConfigError, match=r"^--display: this machine has no screen .*--display-connect .*--display-save"
    ):
        display.start(SPEC, StillCameras())
