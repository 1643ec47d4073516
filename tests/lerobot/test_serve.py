"""LeRobot checkpoints served by a real PolicyServer, driving the simulated arm through a real edge."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lerobot", minversion="0.5", reason="needs servo-robotics[lerobot] (Python >= 3.12)")

from servo.client import SessionRejected
from servo.edge.observation import robot_features
from servo.edge.remote import EdgeStartError, RemoteEngine
from servo.edge.runtime import RunOptions
from servo.recording import read_recording
from servo.server.manifest import Manifest, parse_manifest
from tests.edge.harness import (
    MergeLog,
    edge_config,
    first_error,
    run_edge,
    running_edge,
    small_sim,
    start_server,
)
from tests.server.helpers import connected, open_on
from tests.support import eventually, free_port, running_server


def lerobot_manifest(port: int, checkpoint: Path, *, options: str = "", serving: str = "") -> Manifest:
    return parse_manifest(
        f"""
[model]
source = "lerobot"
warmup = 1
[model.options]
path = "{checkpoint}"
{options}
[serving]
{serving}
[zenoh]
listen = ["tcp/127.0.0.1:{port}"]
[ops]
health_port = 0
"""
    )


async def drive(port: int, *, chunks: int, record: Path | None = None, **edge: object) -> tuple[RemoteEngine, MergeLog]:
    """Run the sim arm against the server on ``port`` until ``chunks`` chunks were merged."""
    sim = small_sim()
    engine = RemoteEngine(edge_config(port, **edge), sim.spec())
    merges = MergeLog.attach(engine)
    options = RunOptions(record_path=None if record is None else str(record), record_images_every=1)
    async with running_edge(sim, engine, options) as run:
        await eventually(lambda: engine.chunks_received >= chunks, 60, f"{chunks} chunks")
        summary = await run.stop()
    assert summary.final_state == "streaming"
    assert summary.parked
    assert summary.actions_executed > 0
    assert summary.errors == 0
    return engine, merges


@pytest.mark.anyio
async def test_act_drives_the_sim_arm(port: int, act_checkpoint: Path, tmp_path: Path) -> None:
    record = tmp_path / "ep.servo"
    manifest = lerobot_manifest(port, act_checkpoint, options='units = "degrees"', serving='default_task = "sweep"')
    async with running_server(manifest) as (_, ready):
        assert ready.info.model == "lerobot/act"
        assert (ready.info.chunk_size, ready.info.supports_rtc, ready.info.serving_mode) == (20, False, "shared")
        async with connected(port, "probe") as client:
            session = await open_on(client, ready, features=robot_features(small_sim().spec()))
            assert session.ack is not None
            # Names, camera, fps and units (declared on both sides) all match: not one warning.
            assert session.ack.warnings == []
            await session.close()
        engine, merges = await drive(port, chunks=3, record=record)
    assert engine.task == "sweep"  # the edge named none: the server's default
    assert all(m.chunk_robot.shape == (20, 6) for m in merges.merges)
    rec = read_recording(record)
    assert rec.header.task == "sweep"
    policy = [f for f in rec.frames if f.source == "policy"]
    assert len(policy) > 10
    assert all(f.provenance is not None for f in policy)


@pytest.mark.anyio
@pytest.mark.parametrize("jpeg_quality", [0, "auto"], ids=["raw", "auto"])
async def test_served_chunks_are_lerobots_own_to_the_last_bit(
    port: int, act_checkpoint: Path, jpeg_quality: int | str
) -> None:
    """Raw frames through Zenoh and the server, against LeRobot's own calls on the same pixels: 0.0
    apart. `auto` sends raw to a server on this machine, so it is exact too."""
    import torch

    from tests.lerobot.test_adapter import lerobot_batch, lerobot_way, observation

    policy, pre, post = lerobot_way(act_checkpoint)
    async with (
        running_server(lerobot_manifest(port, act_checkpoint)) as (_, ready),
        connected(port, "probe", jpeg_quality=jpeg_quality) as client,  # type: ignore[arg-type]
    ):
        session = await open_on(client, ready)
        for _ in range(3):
            obs = observation()
            result = await session.infer(obs.state, obs.images, task=obs.task, timeout=60)
            with torch.no_grad():
                expected = post(policy.predict_action_chunk(pre(lerobot_batch(obs))))
            np.testing.assert_array_equal(result.chunk_robot, expected.squeeze(0).numpy())
        assert session.codec.status().requests["raw"] == 3
        await session.close()


@pytest.mark.anyio
async def test_flow_matching_policy_is_served_with_rtc(port: int, smolvla_checkpoint: Path) -> None:
    async with running_server(lerobot_manifest(port, smolvla_checkpoint, options='units = "degrees"')) as (_, ready):
        assert ready.info.supports_rtc
        engine, merges = await drive(port, chunks=4, rtc=True, execution_horizon=10)
    assert engine.pipeline.rtc  # the server accepted RTC: prefixes travel, chunks replace the queue
    assert len(merges.merges) >= 4
    assert all(m.chunk_robot.shape == (20, 6) and np.isfinite(m.chunk_robot).all() for m in merges.merges)


@pytest.mark.anyio
async def test_chunk_stateful_diffusion_is_served_exclusive(port: int, diffusion_checkpoint: Path) -> None:
    async with running_server(lerobot_manifest(port, diffusion_checkpoint)) as (_, ready):
        assert (ready.info.serving_mode, ready.info.chunk_stateless, ready.info.chunk_size) == ("exclusive", False, 8)
        sim = small_sim()
        engine = RemoteEngine(edge_config(port), sim.spec())
        async with running_edge(sim, engine, RunOptions()) as run:
            await eventually(lambda: engine.chunks_received >= 2, 60, "two chunks")
            async with connected(port, "second-robot") as client:
                with pytest.raises(SessionRejected) as info:
                    await open_on(client, ready)
            summary = await run.stop()
    assert info.value.rejection.code == "capacity"
    assert summary.final_state == "streaming"


@pytest.mark.anyio
async def test_range_m100_100_checkpoint_is_refused_by_a_degrees_robot(port: int, act_checkpoint: Path) -> None:
    manifest = lerobot_manifest(port, act_checkpoint, options='units = "range_m100_100"')
    async with running_server(manifest):
        with pytest.raises(BaseExceptionGroup) as info:
            await RemoteEngine(edge_config(port), small_sim().spec()).run()
    error = first_error(info.value)
    assert isinstance(error, EdgeStartError)
    assert error.refused
    message = str(error)
    assert "policy acts in range -100..100 (LeRobot use_degrees=False) but the robot uses degrees" in message
    assert "--robot-opt use_degrees=false" in message


MINIMAL_MANIFEST = """[model]
source = "lerobot"
options = {{ path = "{path}" }}
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["act", "smolvla"])
def test_three_line_manifest_with_servo_serve_and_servo_edge(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    checkpoint: Path = request.getfixturevalue(f"{kind}_checkpoint")
    port = free_port()
    manifest = tmp_path / "manifest.toml"
    # The three lines a user writes, plus a free port and no health endpoint for the test.
    manifest.write_text(
        MINIMAL_MANIFEST.format(path=checkpoint)
        + f'[zenoh]\nlisten = ["tcp/127.0.0.1:{port}"]\n[ops]\nhealth_port = 0\n'
    )
    server = start_server(manifest, timeout=120)
    summary_path, record = tmp_path / "run.json", tmp_path / "ep.servo"
    try:
        result = run_edge(
            f"--robot sim --robot-opt cameras=front:64x48 --connect tcp/127.0.0.1:{port} --duration 3 "
            f"--summary {summary_path} --record {record}",
            timeout=120,
        )
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr
    summary = json.loads(summary_path.read_text())
    assert summary["final_state"] == "streaming"
    assert summary["chunks_received"] >= 2
    assert summary["actions_executed"] > 30
    assert summary["parked"] is True
    assert f"serving lerobot/{kind}" in server.output
    assert len(read_recording(record).frames) == summary["ticks"]
