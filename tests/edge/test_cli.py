"""``servo-edge`` as a user runs it: exit codes, one-line errors, the run summary."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import anyio
import numpy as np
import pytest

from servo.recording import read_recording
from tests.edge.harness import Proc, edge_argv, run_edge, start_server, write_manifest
from tests.support import free_port, make_manifest, running_server

SUMMARY_KEYS = {
    "ticks",
    "actions_executed",
    "fallback_ticks",
    "chunks_received",
    "chunks_dropped",
    "reconnects",
    "rtt_ms",
    "tick_jitter_ms",
    "final_state",
}


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("servo-edge: error:")]


@pytest.mark.anyio
async def test_capability_mismatch_exits_2_with_the_reason(port: int) -> None:
    async with running_server(make_manifest(port)):
        result = await anyio.run_process(
            edge_argv(f"--robot sim --robot-opt cameras=none --connect tcp/127.0.0.1:{port} --log-level warning"),
            check=False,
            stderr=subprocess.STDOUT,
        )
    output = result.stdout.decode()
    assert result.returncode == 2, output
    assert "Traceback" not in output
    (line,) = error_lines(output)
    assert "server refused this robot" in line
    assert "camera(s) front" in line
    assert output.strip() == line  # nothing else at warning level: one clear message


@pytest.mark.parametrize("mode", ["client", "peer"])
def test_unreachable_server_exits_1_in_one_line_within_the_connect_timeout(mode: str) -> None:
    port = free_port()
    result = run_edge(
        f"--robot sim --connect tcp/127.0.0.1:{port} --connect-timeout-s 2 --zenoh-mode {mode} --log-level warning"
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output
    (line,) = error_lines(output)
    assert line.startswith(f"servo-edge: error: no usable servo server at tcp/127.0.0.1:{port} within 2 s (")
    assert line.endswith("is servo-serve running there? (--connect, --connect-timeout-s)")
    assert ".rs:" not in line
    assert " at /" not in line


def test_bad_option_exits_2() -> None:
    result = run_edge("--robot sim --buffer-time-s 0")
    assert result.returncode == 2
    (line,) = error_lines(result.stderr)
    assert "buffer_time_s" in line
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_summary_against_servo_serve(tmp_path: Path) -> None:
    port = free_port()
    server = start_server(write_manifest(tmp_path / "manifest.toml", port))
    summary_path, record = tmp_path / "run.json", tmp_path / "ep.servo"
    try:
        result = run_edge(
            f"--robot sim --robot-opt cameras=front:64x48 --connect tcp/127.0.0.1:{port} --duration 3 "
            f"--summary {summary_path} --record {record}"
        )
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr
    summary = json.loads(summary_path.read_text())
    assert set(summary) >= SUMMARY_KEYS
    assert set(summary["rtt_ms"]) == {"p50", "p99"}
    assert set(summary["tick_jitter_ms"]) == {"p50", "p99", "max"}
    assert summary["final_state"] == "streaming"
    assert summary["chunks_received"] >= 3
    assert summary["reconnects"] == 0
    assert summary["actions_executed"] > 60
    assert summary["parked"] is True
    assert 0 < summary["rtt_ms"]["p50"] <= summary["rtt_ms"]["p99"]
    assert summary["tick_jitter_ms"]["p99"] <= summary["tick_jitter_ms"]["max"]
    # jpeg_quality = auto (the default): the summary says what it chose and what it measured
    codec = summary["codec"]
    assert codec["auto"] is True
    assert codec["current"] in codec["requests"]
    assert sum(codec["requests"].values()) >= summary["chunks_received"]
    frames = read_recording(record).frames
    assert len(frames) == summary["ticks"]
    running = [f for f in frames if f.source != "park"]  # the park at the end adds its own ticks
    assert 60 <= len(running) <= 100  # 3 s at 30 Hz
    policy = [f for f in frames if f.source == "policy"]
    assert len(policy) == summary["actions_executed"]
    assert all(f.provenance is not None for f in policy)
    assert "servo-edge: duration elapsed" in result.stderr


def far_pose() -> np.ndarray:
    from servo.robots import make_robot

    spec = make_robot("sim", {"cameras": "none"}).spec
    return np.asarray(spec.rest_pose, np.float32) + np.array([60, 60, -60, -40, 0, 30], np.float32)


def far_trajectory(path: Path) -> Path:
    """A replay that holds the arm far from its rest pose (so parking takes a while)."""
    from servo.recording import EpisodeHeader, FrameRecord, RecordingWriter
    from servo.robots import make_robot
    from servo.wire import encode_tensor

    spec = make_robot("sim", {"cameras": "none"}).spec
    pose = far_pose()
    writer = RecordingWriter(path, EpisodeHeader(robot="sim", fps=30.0, joint_names=list(spec.joint_names)))
    for i in range(30):
        writer.write(FrameRecord(i, i, encode_tensor(pose), encode_tensor(pose), "policy"))
    writer.close()
    return path


@pytest.mark.slow
def test_second_interrupt_still_parks_and_a_third_exits_at_once(tmp_path: Path) -> None:
    replay = far_trajectory(tmp_path / "far.servo")
    summary = tmp_path / "run.json"
    start = ",".join(str(float(q)) for q in far_pose())  # the arm starts there: parking takes ~2 s
    argv = edge_argv(
        f"--robot sim --robot-opt cameras=none --robot-opt initial_pose={start} --replay {replay} --loop "
        f"--velocity-scale 0.2 --summary {summary}"
    )
    edge = Proc(argv)
    try:
        edge.wait_line("control loop running", 30)
        edge.popen.send_signal(signal.SIGINT)
        edge.wait_line("stopping", 10)
        edge.popen.send_signal(signal.SIGINT)
        edge.wait_line("servo-edge: interrupted again: still parking the arm", 10)
        assert edge.wait(30) == 0, edge.output
    finally:
        edge.kill()
    assert "Traceback" not in edge.output
    assert json.loads(summary.read_text())["parked"] is True

    edge = Proc(argv)
    try:
        edge.wait_line("control loop running", 30)
        # Standard signals do not queue: each waits until the previous one was handled.
        edge.popen.send_signal(signal.SIGINT)
        edge.wait_line("stopping", 10)
        edge.popen.send_signal(signal.SIGINT)
        edge.wait_line("interrupted again", 10)
        edge.popen.send_signal(signal.SIGINT)
        assert edge.wait(5) == 130
    finally:
        edge.kill()
    assert "servo-edge: interrupted a third time: exiting now" in edge.output
    assert "Traceback" not in edge.output


def test_record_never_replaces_a_file_unless_asked(tmp_path: Path) -> None:
    replay = far_trajectory(tmp_path / "far.servo")
    before = replay.read_bytes()
    result = run_edge(f"--robot sim --robot-opt cameras=none --replay {replay} --record {replay}")
    assert result.returncode == 2, result.stderr
    (line,) = error_lines(result.stderr)
    assert line == f"servo-edge: error: --record: {replay} exists; pass --overwrite to replace it"
    assert replay.read_bytes() == before


def test_replay_summary_line_has_no_missing_values(tmp_path: Path) -> None:
    replay = far_trajectory(tmp_path / "far.servo")
    result = run_edge(f"--robot sim --robot-opt cameras=none --replay {replay} --log-level warning")
    assert result.returncode == 0, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("servo-edge: finished;")
    assert "None" not in last


def test_a_nan_replay_is_refused_before_anything_moves(tmp_path: Path) -> None:
    """A non-finite frame in a replay file is refused when the file is read: one line naming the
    file, the frame and the field, and the arm never moves (it used to exit 0, unparked). The
    control process's own last-resort guard is exercised by tests/edge/test_runtime.py."""
    from servo.recording import EpisodeHeader, FrameRecord, RecordingWriter
    from servo.robots import make_robot
    from servo.wire import encode_tensor

    spec = make_robot("sim", {"cameras": "none"}).spec
    rest = np.asarray(spec.rest_pose, np.float32)
    replay, summary_path = tmp_path / "nan.servo", tmp_path / "run.json"
    writer = RecordingWriter(replay, EpisodeHeader(robot="sim", fps=30.0, joint_names=list(spec.joint_names)))
    for i in range(40):
        pose = rest + np.float32(i / 4)
        if i == 25:
            pose[1] = np.nan
        writer.write(FrameRecord(i, i, encode_tensor(pose), encode_tensor(pose), "policy"))
    writer.close()
    result = run_edge(
        f"--robot sim --robot-opt cameras=none --replay {replay} --summary {summary_path} "
        "--duration 30 --log-level warning"
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert (
        last
        == f"servo-edge: error: cannot replay {str(replay)!r}: {replay}: frame 25 (tick 25) state contains NaN or inf"
    )
    assert not summary_path.exists()  # nothing ran
