"""The server dies mid-episode (SIGKILL) and comes back: the edge rides through, or refuses a
different model. Real ``servo-serve`` subprocesses, real Zenoh on 127.0.0.1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servo.edge.failsafe import EngineState
from servo.edge.remote import RemoteEngine
from servo.edge.runtime import RunOptions
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
