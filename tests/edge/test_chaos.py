"""The server dies mid-episode (SIGKILL) and comes back: the edge rides through, or refuses a
different model, and never runs a step twice. Real ``servo-serve`` subprocesses, real Zenoh on
127.0.0.1.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from servo.edge.exactness import check_steps
from servo.edge.failsafe import EngineState
from servo.edge.remote import RemoteEngine
from servo.edge.runtime import RunOptions
from servo.recording import read_recording
from tests.edge.fakes import wait_for
from tests.edge.harness import (
    Proc,
    edge_argv,
    edge_config,
    running_edge,
    small_sim,
    start_server,
    write_manifest,
)
from tests.support import eventually, free_port

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_server_killed_mid_episode_then_back(tmp_path: Path) -> None:
    port = free_port()
    manifest = write_manifest(tmp_path / "manifest.toml", port)
    server = start_server(manifest)
    try:
        robot = small_sim()
        engine = RemoteEngine(edge_config(port, max_offline_s=60.0), robot.spec())
        async with running_edge(robot, engine, RunOptions()) as run:
            await eventually(lambda: engine.chunks_received >= 3, 15, "streaming")
            loop = run.runtime.loop
            assert loop is not None
            first = engine.session
            assert first is not None
            chunks, fallback = engine.chunks_received, engine.pipeline.fallback_ticks

            server.kill()
            await eventually(lambda: engine.state is EngineState.RECONNECTING, 5, "RECONNECTING")
            # The queue rides on, then the fallback (hold: send nothing) takes over.
            await eventually(lambda: engine.pipeline.fallback_ticks >= fallback + 15, 5, "fallback ticks")
            sent = loop.statistics().commands_sent
            ticks = loop.statistics().ticks
            await eventually(lambda: loop.statistics().ticks >= ticks + 10, 5)
            assert loop.statistics().commands_sent == sent  # the robot holds
            assert loop.running
            assert loop.error == ""
            assert engine.chunks_received == chunks

            server = start_server(manifest)
            await eventually(lambda: engine.chunks_received >= chunks + 3, 20, "streaming again")
            assert engine.state is EngineState.STREAMING
            assert engine.session is not None
            assert engine.session is not first
            assert engine.session.session_id != first.session_id
            assert engine.session.epoch > first.epoch
            assert engine.failsafe.reconnects == 1
            assert loop.statistics().commands_sent > sent
            summary = await run.stop()
    finally:
        server.stop()
    assert summary.reconnects == 1
    assert summary.final_state == "streaming"
    assert summary.parked
    states = [state for state, _ in summary.transitions]
    assert states[:2] == ["connecting", "streaming"]
    assert "reconnecting" in states
    assert states[-1] == "streaming"


def test_server_back_with_a_different_model_is_dead(tmp_path: Path) -> None:
    port = free_port()
    summary_path = tmp_path / "run.json"
    server = start_server(write_manifest(tmp_path / "a.toml", port, revision="v1"))
    edge = Proc(
        edge_argv(
            f"--robot sim --robot-opt cameras=front:64x48 --connect tcp/127.0.0.1:{port} --summary {summary_path} "
            "--reconnect-initial-backoff-s 0.1 --reconnect-max-backoff-s 0.5 --duration 120"
        )
    )
    try:
        edge.wait_line("state=streaming", 30)
        server.kill()
        edge.wait_line("state=reconnecting", 10)
        chunk_25 = "cameras = {front = [48, 64]}\nchunk_size = 25"
        server = start_server(write_manifest(tmp_path / "b.toml", port, options=chunk_25))
        rc = edge.wait(30)
    finally:
        edge.kill()
        server.stop()
    output = edge.output
    assert rc == 3, output
    assert "Traceback" not in output
    summary = json.loads(summary_path.read_text())
    assert summary["final_state"] == "dead"
    assert summary["parked"] is True  # safe teardown: rest pose, then disconnect
    assert "different model" in summary["stop_reason"]
    assert "chunk_size 25 (was 20)" in summary["stop_reason"]
    assert "rest pose reached" in output
    assert "disconnected" in output


@pytest.mark.timeout(400)  # four server starts at load 16: a minute each at worst
def test_no_step_runs_twice_through_server_kills_at_random_moments(tmp_path: Path) -> None:
    """``servo-edge --record`` while its server is killed three times at a random moment (a few
    to a few hundred ticks into a session) and restarted: the recording alone shows every step
    of every chunk run once (`check_steps`)."""
    moments = random.Random(30)
    port = free_port()
    manifest = write_manifest(tmp_path / "manifest.toml", port)
    recording = tmp_path / "run.servo"
    server = start_server(manifest)
    edge = Proc(
        edge_argv(
            f"--robot sim --robot-opt cameras=front:64x48 --connect tcp/127.0.0.1:{port} --record {recording} "
            "--reconnect-initial-backoff-s 0.1 --reconnect-max-backoff-s 0.5 --duration 600"
        )
    )

    def seen(text: str) -> int:
        return sum(text in line for line in list(edge.lines))

    def recorded() -> int:
        return recording.stat().st_size if recording.exists() else 0

    def streamed(sessions: int, blocks: int) -> None:
        """Wait for session number ``sessions`` to stream, then for ``blocks`` more blocks of ticks."""
        wait_for(lambda: seen("state=streaming") >= sessions, 60, f"streaming, session {sessions}")
        grown = recorded() + blocks * 8192  # the recorder writes blocks of 8 KiB: 1 to 2 s of ticks
        wait_for(lambda: recorded() >= grown, 60, "ticks recorded")

    def reconnecting(kills: int) -> None:
        wait_for(lambda: seen("state=reconnecting") >= kills, 10, f"reconnecting, kill {kills}")

    try:
        for kill in range(1, 4):
            streamed(kill, moments.choice([1, 2, 4]))
            server.kill()
            reconnecting(kill)
            server = start_server(manifest)
        streamed(4, 1)
        edge.stop()  # SIGTERM: the safe teardown, then the recording is closed
    finally:
        edge.kill()
        server.stop()
    report = check_steps(read_recording(recording).frames)
    assert report.exact, report.summary()
    assert report.chunks - report.unverified >= 20, report.summary()
