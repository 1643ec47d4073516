"""The contract that lets a policy move from the robot to a server without changing behaviour:
on the same observations, a deterministic policy and scripted latencies, remote RTC and local
RTC produce byte-identical merged queues and executed action streams."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio
import numpy as np
import pytest

from servo.edge.config import EdgeConfig, load_edge_config
from servo.edge.engine import EngineBase
from servo.edge.local import RtcEngine
from servo.edge.observation import ObservationInput
from servo.edge.pipeline import Produced, Request
from servo.edge.remote import RemoteEngine
from servo.policy.reference import ReferencePolicy
from servo.robots import SimCameraConfig, SimConfig, SimSO100
from tests.support import make_manifest, running_server

pytestmark = pytest.mark.anyio

CAMERA = (48, 64)
#: Chunk latency of each request, in control ticks: fast, slow, a stall longer than the buffer.
LATENCIES = [3, 7, 1, 12, 5, 9, 2, 30, 4, 6, 8, 3]
TICKS = 400


def policy() -> ReferencePolicy:
    return ReferencePolicy(cameras={"front": CAMERA}, chunk_size=20, seed=7)


def observation(tick: int, now_ns: int, position: int) -> ObservationInput:
    # A deterministic, non-trivial sequence: the state drifts, the frame changes with it.
    state = (np.sin(np.arange(6) + tick / 17.0) * (10 + tick % 5)).astype(np.float32)
    frame = np.full((*CAMERA, 3), tick % 251, dtype=np.uint8)
    frame[:, : tick % CAMERA[1]] = 255 - tick % 200
    return ObservationInput(state=state, images={"front": frame}, mono_ns=now_ns, tick=tick, position=position)


Produce = Callable[[Request, bool], Awaitable[Produced]]


async def drive(engine: EngineBase, produce: Produce) -> tuple[list[bytes | None], list[tuple[bytes, bytes, int]]]:
    """A scripted control loop on a virtual clock: one tick per iteration; a request's chunk is
    merged exactly LATENCIES[k] ticks after its observation, before that tick's observation."""
    dt = engine.pipeline.dt_ns
    t0 = time.monotonic_ns()
    executed: list[bytes | None] = []
    merges: list[tuple[bytes, bytes, int]] = []
    pending: tuple[Request, Produced, int] | None = None
    requests = 0
    for tick in range(TICKS):
        now = t0 + tick * dt
        if pending is not None and tick == pending[2]:
            trimmed = engine.merge(pending[0], pending[1], now)
            assert trimmed is not None
            queue = engine.pipeline.queue
            merges.append(
                (
                    queue.get_left_over().tobytes(),
                    queue.get_processed_left_over().tobytes(),
                    trimmed,
                )
            )
            pending = None
        obs = observation(tick, now, engine.pipeline.queue.get_position())
        if pending is None and engine.pipeline.needs_observation():
            request = engine.pipeline.snapshot(obs)
            produced = await produce(request, engine.take_episode_start())
            pending = (request, produced, tick + LATENCIES[requests % len(LATENCIES)])
            requests += 1
        action = engine.get_action(now)
        executed.append(None if action is None else action.values.tobytes())
    return executed, merges


def config(**overrides: object) -> EdgeConfig:
    base = {
        "rtc": True,
        "jpeg_quality": 0,
        "buffer_time_s": 0.3,
        "execution_horizon": 8,
        "max_action_age_s": 60.0,
    }
    return load_edge_config(flags={**base, **overrides})


async def test_remote_rtc_and_local_rtc_are_byte_identical(port: int) -> None:
    spec = SimSO100(SimConfig(cameras=(SimCameraConfig("front", *CAMERA),))).spec

    local = RtcEngine(config(), spec, policy=policy())
    await anyio.to_thread.run_sync(local.load)

    async def local_produce(request: Request, start: bool) -> Produced:
        return await anyio.to_thread.run_sync(lambda: local.infer(request, episode_start=start))

    local_executed, local_merges = await drive(local, local_produce)

    manifest = make_manifest(port, options="cameras = {front = [48, 64]}")
    async with running_server(manifest, policy=policy()):
        remote = RemoteEngine(config(connect=[f"tcp/127.0.0.1:{port}"]), spec)
        remote.pause()  # the engine connects, but the scripted driver below makes every request
        async with anyio.create_task_group() as tg:
            with anyio.fail_after(20):
                await tg.start(remote.run)

            async def remote_produce(request: Request, start: bool) -> Produced:
                produced = await remote.produce(request, episode_start=start)
                assert produced is not None
                return produced

            remote_executed, remote_merges = await drive(remote, remote_produce)
            tg.cancel_scope.cancel()

    # The scenario must exercise what parity is about: RTC trimming and prefixes, a stall.
    assert any(trimmed > 0 for _, _, trimmed in local_merges)
    assert None in local_executed, "the 30-tick stall should have starved the queue at least once"
    assert len({a for a in local_executed if a is not None}) > 50
    assert len(local_merges) >= 10
    assert remote_merges == local_merges
    assert remote_executed == local_executed
