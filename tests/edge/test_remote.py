"""The remote engine against a real in-process PolicyServer over real Zenoh on 127.0.0.1."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from servo.edge.errors import EdgeStartError
from servo.edge.failsafe import EngineState
from servo.edge.remote import RemoteEngine
from servo.edge.runtime import RunOptions
from servo.edge.safety import SafetyLimiter
from servo.policy.reference import make_reference_policy
from servo.recording import read_recording
from servo.robots.protocol import RobotSpec
from servo.robots.sim import SimConfig, SimSO100
from tests.edge.harness import (
    GatedPolicy,
    MergeLog,
    edge_config,
    first_error,
    running_edge,
    small_sim,
)
from tests.support import eventually, lose_chunks, make_manifest, running_server

pytestmark = pytest.mark.anyio

CHUNK_20 = "cameras = {front = [48, 64]}\nchunk_size = 20"


async def test_sim_arm_follows_the_policy(port: int, tmp_path: Path) -> None:
    record = tmp_path / "ep.servo"
    # The edge names no task: the recording must carry the one the server used.
    async with running_server(make_manifest(port, options=CHUNK_20, extra='[serving]\ndefault_task = "sweep"')):
        sim = small_sim()
        engine = RemoteEngine(edge_config(port), sim.spec())
        log = MergeLog.attach(engine)
        async with running_edge(sim, engine, RunOptions(record_path=str(record))) as run:
            await eventually(lambda: engine.chunks_received >= 4, 10, "four chunks")
            await eventually(lambda: run.runtime.loop is not None and run.runtime.loop.statistics().ticks >= 45, 10)
            assert engine.state is EngineState.STREAMING
            summary = await run.stop()
    assert summary.parked
    assert summary.final_state == "streaming"
    assert summary.chunks_received == engine.chunks_received >= 4

    rec = read_recording(record)
    assert rec.header.task == engine.task == "sweep"
    frames = rec.frames
    assert len(frames) == summary.ticks
    merges = {(m.session_id, m.seq_id): m for m in log.merges}
    policy = [f for f in frames if f.source == "policy"]
    assert len(policy) == summary.actions_executed > 30
    assert all(f.provenance is not None for f in policy)  # provenance on every policy action
    assert {f.source for f in frames} <= {"policy", "none", "park"}

    # Replay the run through a fresh limiter: every executed command is the merged chunk's
    # robot-space action (the first untrimmed step onwards), after joint and slew limits.
    limiter = SafetyLimiter(sim.spec())
    limiter.start_from(_f32(frames[0].state))
    taken: Counter[tuple[int, int]] = Counter()
    rest = np.asarray(sim.spec().rest_pose, np.float32)
    for frame in frames:
        if frame.source == "policy":
            assert frame.provenance is not None
            session_id, seq_id, episode_id, _ = frame.provenance
            merge = merges[(session_id, seq_id)]
            assert episode_id == merge.episode_id == 0
            raw = merge.chunk_robot[merge.trimmed + taken[(session_id, seq_id)]]
            taken[(session_id, seq_id)] += 1
            expected = limiter.apply(raw)
        elif frame.source == "park":
            expected = limiter.apply(rest)
        else:
            assert frame.action is None
            continue
        assert frame.action is not None
        np.testing.assert_allclose(_f32(frame.action), expected, atol=1e-5)

    # The arm tracks its commands (a first-order lag of 75 ms): a few ticks later it is where
    # it was told to be, and it really moved (the policy sweeps the pan joint).
    states = rec.states()
    acted = [i for i, f in enumerate(frames) if f.action is not None]
    commands = np.vstack([_f32(frames[i].action) for i in acted])
    later = states[[min(i + 4, len(states) - 1) for i in acted]]
    error = np.abs(later - commands)
    assert float(np.median(error)) < 2.0
    assert np.ptp(states[:, 0]) > 5.0
    assert np.max(np.abs(states[-1] - rest)) <= RunOptions().rest_tolerance + 0.5


async def test_capability_mismatch_refuses_with_the_reason(port: int) -> None:
    async with running_server(make_manifest(port)):
        five = _spec(joints=5, cameras={})
        with pytest.raises(BaseExceptionGroup) as info:
            await RemoteEngine(edge_config(port), five).run()
        error = first_error(info.value)
        assert isinstance(error, EdgeStartError)
        assert error.refused
        assert "server refused this robot" in str(error)
        assert "action names" in str(error)

        no_camera = SimSO100(SimConfig(cameras=())).spec
        with pytest.raises(BaseExceptionGroup) as info:
            await RemoteEngine(edge_config(port), no_camera).run()
        error = first_error(info.value)
        assert isinstance(error, EdgeStartError)
        assert error.refused
        assert "camera(s) front" in str(error)


async def test_unreachable_server_is_one_clear_error(port: int) -> None:
    engine = RemoteEngine(edge_config(port, connect_timeout_s=0.5), small_sim().spec())
    with pytest.raises(BaseExceptionGroup) as info:
        await engine.run()
    error = first_error(info.value)
    assert isinstance(error, EdgeStartError)
    assert not error.refused
    assert f"tcp/127.0.0.1:{port}" in str(error)


@pytest.mark.parametrize("jpeg_quality", [90, 0])
async def test_reset_clears_the_queue_and_bumps_the_episode(port: int, tmp_path: Path, jpeg_quality: int) -> None:
    # jpeg_quality=0 sends raw frames: nothing yields between the reset and the next request,
    # which must nevertheless carry the new episode (or the server drops it as stale).
    record = tmp_path / "ep.servo"
    async with running_server(make_manifest(port, options=CHUNK_20)) as (server, _):
        sim = small_sim()
        # A request lost across the reset would hang for request_timeout_s, far past the wait.
        config = edge_config(port, jpeg_quality=jpeg_quality, request_timeout_s=30.0)
        engine = RemoteEngine(config, sim.spec())
        log = MergeLog.attach(engine)
        async with running_edge(sim, engine, RunOptions(record_path=str(record))) as run:
            await eventually(lambda: engine.chunks_received >= 2, 10, "two chunks")
            assert run.runtime.loop is not None
            reset_tick = run.runtime.loop.statistics().ticks
            merges_before = len(log.merges)
            engine.reset()
            assert engine.pipeline.queue.empty()  # at once, before any await
            assert engine.pipeline.episode_id == 1
            await eventually(lambda: len(log.merges) >= merges_before + 2, 10, "new chunks")
            session = engine.session
            assert session is not None
            await eventually(lambda: _server_episode(server, session.session_id) == 1, 5, "server reset")
            await eventually(lambda: run.runtime.loop.statistics().ticks >= reset_tick + 20, 5)  # type: ignore[union-attr]
            summary = await run.stop()
    assert summary.final_state == "streaming"
    assert all(m.episode_id == 1 for m in log.merges[merges_before:])
    after = [f for f in read_recording(record).frames if f.tick > reset_tick + 1]
    policy_after = [f for f in after if f.source == "policy"]
    assert policy_after
    assert all(f.provenance is not None and f.provenance[2] == 1 for f in policy_after)


async def test_pause_stops_requests_while_the_queue_drains(port: int) -> None:
    async with running_server(make_manifest(port, options=CHUNK_20)):
        sim = small_sim()
        engine = RemoteEngine(edge_config(port), sim.spec())
        async with running_edge(sim, engine) as run:
            await eventually(lambda: engine.chunks_received >= 2, 10, "two chunks")
            loop = run.runtime.loop
            assert loop is not None
            engine.pause()
            requests, fallback = engine.requests, engine.pipeline.fallback_ticks
            await eventually(
                lambda: engine.pipeline.queue.empty() and engine.pipeline.fallback_ticks > fallback + 5,
                5,
                "the queue to drain",
            )
            # A request already on its way when pause() came may finish; no new one leaves.
            sent = engine.requests
            assert sent <= requests + 1
            drained_at = loop.statistics().ticks
            await eventually(lambda: loop.statistics().ticks >= drained_at + 10, 5)
            assert engine.requests == sent
            assert engine.pipeline.queue.empty()
            await eventually(lambda: engine.state is EngineState.STALLED, 2, "STALLED")
            chunks = engine.chunks_received
            engine.resume()
            await eventually(lambda: engine.chunks_received >= chunks + 2, 10, "chunks again")
            assert engine.requests > sent
            await eventually(lambda: engine.state is EngineState.STREAMING, 2, "STREAMING")
            await run.stop()
    assert loop.error == ""


async def test_staleness_bound_trips_when_chunks_stop(port: int, tmp_path: Path) -> None:
    record = tmp_path / "ep.servo"
    policy = GatedPolicy(cameras={"front": (48, 64)})
    max_age_s = 0.5
    async with running_server(make_manifest(port), policy=policy):
        policy.budget = 1  # one chunk (50 actions = 1.7 s), then the policy hangs
        try:
            sim = small_sim()
            config = edge_config(port, max_action_age_s=max_age_s, request_timeout_s=30.0)
            engine = RemoteEngine(config, sim.spec())
            async with running_edge(sim, engine, RunOptions(record_path=str(record))) as run:
                await eventually(lambda: engine.chunks_received == 1, 10, "the only chunk")
                await eventually(lambda: engine.pipeline.stale_refusals >= 1, 5, "staleness")
                await eventually(lambda: engine.state is EngineState.STALLED, 2, "STALLED")
                await eventually(policy.blocked.is_set, 5, "the next request to hang in the policy")
                fallback = engine.pipeline.fallback_ticks
                await eventually(lambda: engine.pipeline.fallback_ticks >= fallback + 10, 5)
                summary = await run.stop()
        finally:
            policy.release.set()
    assert summary.stale_refusals >= 1
    assert summary.chunks_received == 1
    # The queue held 1.7 s of actions; only those younger than the bound ran.
    assert summary.actions_executed < 0.5 * 50
    max_age_ns = round(max_age_s * 1e9)
    policy_frames = [f for f in read_recording(record).frames if f.source == "policy"]
    assert policy_frames
    for frame in policy_frames:
        assert frame.provenance is not None
        assert frame.mono_ns - frame.provenance[3] <= max_age_ns


async def test_a_chunk_lost_on_the_way_back_is_asked_for_again_long_before_the_timeout(
    port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = small_sim()
    engine = RemoteEngine(edge_config(port, request_timeout_s=30.0), sim.spec())

    def lost(seq: int) -> bool:
        # One loss, from the third request on, of a request not sent again yet: at load a slow
        # answer may already have been copied, and a copy whose answer is lost too is (rightly)
        # waited out to the timeout.
        session = engine.session
        unique = session is not None and session.protocol.latest_seq == seq and session.protocol.resent_seq == 0
        return seq >= 3 and not dropped and unique

    dropped = lose_chunks(monkeypatch, lost)
    async with (
        running_server(make_manifest(port, options=CHUNK_20)),
        running_edge(sim, engine, RunOptions()) as run,
    ):
        # Twenty actions a chunk at 30 Hz: waiting out the timeout would hold the arm ~29 s.
        await eventually(lambda: len(dropped) == 1 and engine.chunks_received >= 4, 10, "the chunks after the lost one")
        session = engine.session
        assert session is not None
        assert session.stats.resent >= 1
        summary = await run.stop()
    assert len(dropped) == 1
    assert dropped[0] >= 3
    assert summary.timeouts == 0
    assert summary.resent >= 1


def _f32(tensor: Any) -> np.ndarray:
    from servo.wire import decode_tensor

    return np.array(decode_tensor(tensor, dtype="float32"), dtype=np.float32)


def _spec(*, joints: int, cameras: dict[str, Any]) -> RobotSpec:
    return RobotSpec(
        name="odd",
        fps=30.0,
        joint_names=tuple(f"j{i}.pos" for i in range(joints)),
        cameras=cameras,
        lower=(-1.0,) * joints,
        upper=(1.0,) * joints,
        max_velocity=(1.0,) * joints,
        rest_pose=(0.0,) * joints,
    )


def _server_episode(server: Any, session_id: int) -> int | None:
    session = server.registry.get(session_id)
    return None if session is None else int(session.episode_id)


async def test_a_policy_slower_than_its_chunk_shows_degraded_before_the_queue_runs_dry(port: int) -> None:
    # 0.7 s forwards and 30-step chunks (1 s at 30 fps): what is left of a chunk once its own round
    # trip passed (0.3 s) cannot cover the next one, however early the edge asks.
    options = "cameras = {front = [48, 64]}\nchunk_size = 30\ncompute_ms = 700"
    async with running_server(make_manifest(port, options=options)):
        sim = small_sim()
        engine = RemoteEngine(edge_config(port), sim.spec())  # default timing options
        async with running_edge(sim, engine) as run:
            await eventually(lambda: engine.chunks_received >= 3, 20, "three chunks")
            # Said in the status line, with the chunk length that would do.
            starving = engine.statistics().starving
            # ... and, in the run summary, as why the robot stalled.
            short = lambda: [c for c in engine.failsafe.stall_causes if c.startswith("chunks too short")]  # noqa: E731
            await eventually(lambda: bool(short()), 20, "a stall blamed on the short chunks")
            summary = await run.stop()
    assert "chunks too short: 30 steps, need >= " in starving
    assert any(cause.startswith("chunks too short: 30 steps") for cause in summary.stalls)
    states = [state for state, _ in summary.transitions]
    assert "degraded" in states
    # After the first chunk (no round trip measured before it) the forecast precedes every stall.
    first_stream = states.index("streaming")
    for i, state in enumerate(states[first_stream + 1 :], first_stream + 1):
        if state == "stalled":
            assert states[i - 1] == "degraded", states


async def test_a_policy_slower_than_the_buffer_is_asked_early_enough_never_to_run_dry(port: int) -> None:
    # 0.7 s forwards, 50-step chunks (1.67 s): enough for one in flight, when the request leaves
    # before the queue holds less than a round trip (the 0.5 s buffer alone would starve it).
    async with running_server(make_manifest(port, options="cameras = {front = [48, 64]}\ncompute_ms = 700")):
        sim = small_sim()
        engine = RemoteEngine(edge_config(port), sim.spec())  # default timing options
        async with running_edge(sim, engine) as run:
            await eventually(lambda: engine.chunks_received >= 2, 20, "streaming")
            # The control loop starves until the first chunk: count from the second one.
            fallback = engine.pipeline.fallback_ticks
            chunks = engine.chunks_received
            await eventually(lambda: engine.chunks_received >= chunks + 4, 20, "four more chunks")
            assert engine.pipeline.fallback_ticks == fallback
            assert engine.state is EngineState.STREAMING
            assert not engine.statistics().starving
            await run.stop()


@pytest.mark.parametrize("teardown", [False, True])
async def test_no_reconnect_once_the_teardown_began(port: int, teardown: bool) -> None:
    async with running_server(make_manifest(port, options=CHUNK_20)) as (server, _):
        sim = small_sim()
        engine = RemoteEngine(edge_config(port), sim.spec())
        async with running_edge(sim, engine) as run:
            await eventually(lambda: engine.chunks_received >= 2, 10, "two chunks")
            epoch = engine.session.epoch if engine.session is not None else -1
            if teardown:
                engine.begin_teardown()  # what the runtime does before it parks the arm
            server.drain()  # the drain notice ends the session
            # The reconnect attempt (if any) starts in the same step that drops the session.
            await eventually(lambda: engine.session is None or engine.session.epoch != epoch, 5, "session lost")
            reconnected = engine.failsafe.reconnects == 1 and engine._epoch > epoch
            assert reconnected is not teardown
            await run.stop()


def test_the_dead_reason_names_every_field_that_differed() -> None:
    from servo.edge.replicas import model_differences
    from servo.policy.compatibility import describe

    info = describe(make_reference_policy(cameras={"front": (48, 64)}).spec, serving_mode="shared", revision="v1")
    assert model_differences(info, info) == []
    other = msgspec.structs.replace(
        info,
        chunk_size=info.chunk_size + 5,
        features=msgspec.structs.replace(info.features, action_names=[*info.features.action_names[:-1], "grip"]),
    )
    differences = model_differences(info, other)
    assert differences == [
        f"chunk_size {info.chunk_size + 5} (was {info.chunk_size})",
        f"features.action_names {other.features.action_names!r} (was {info.features.action_names!r})",
    ]
