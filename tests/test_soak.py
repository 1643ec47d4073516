"""Soak: memory stays flat over 10⁵ requests on the server, the client and the edge loop.

Every per-request statistic is a fixed window, a histogram or a counter, so once warmed up the
resident set size of each part must not follow the number of requests. Observations are tiny
(6 joints, one 8x8 camera sent raw) so that 10⁵ round trips take minutes, not hours. RSS is read
from /proc (Linux); each part is measured on its own: the server in its own process, the client
(`RemoteSession`) in this one, then the edge path (`EngineBase` + `EdgeRuntime` here, the control
loop in its own process) with the network cut out, so that its request rate is not the network's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import numpy as np
import pytest

from servo.client import PolicyClient
from servo.client.results import ENCODE_WINDOW
from servo.edge.actions import ControlConfig
from servo.edge.channel import LATENESS_BINS
from servo.edge.config import EdgeConfig
from servo.edge.control_process import ProcessControlLoop
from servo.edge.failsafe import MAX_TRANSITIONS, FailSafeConfig
from servo.edge.pipeline import PipelineConfig
from servo.edge.runtime import EdgeRuntime, RunOptions
from servo.robots import RobotDescription
from testbed.processes import rss_mb
from tests.edge.fakes import EchoEngine
from tests.edge.harness import start_server, write_manifest
from tests.support import client_settings

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(900)]

REQUESTS = 100_000
WARMUP = 5_000
SAMPLE_EVERY = 10_000
#: Allowed RSS drift after warm-up, either way.
TOLERANCE_MB = 10.0
#: The edge loop's robot rate (the sim's highest): 10⁵ requests take under two minutes.
EDGE_FPS = 1000.0


@dataclass
class RssLog:
    """RSS samples of one process, taken after warm-up at request counts."""

    name: str
    pid: int | None = None
    samples: list[tuple[int, float]] = field(default_factory=list)

    def sample(self, requests: int) -> None:
        self.samples.append((requests, rss_mb(self.pid)))

    def report(self) -> str:
        points = ", ".join(f"{n}: {mb:.1f}" for n, mb in self.samples)
        return f"{self.name} RSS (MiB) after n requests: {points}"

    def assert_flat(self) -> None:
        (_, base), *_ = self.samples
        drift = max(abs(mb - base) for _, mb in self.samples)
        assert drift <= TOLERANCE_MB, f"{self.report()}; drift {drift:.1f} MiB > {TOLERANCE_MB} MiB"


async def test_server_and_client_memory_stays_flat(tmp_path: Path, port: int) -> None:
    manifest = write_manifest(tmp_path / "soak.toml", port, options="cameras = {front = [8, 8]}\nchunk_size = 2")
    server = await anyio.to_thread.run_sync(start_server, manifest)
    server_rss, client_rss = RssLog("server", server.popen.pid), RssLog("client")
    started = time.monotonic()
    try:
        async with PolicyClient.connect(client_settings(port), "soak", jpeg_quality=0) as client:
            (info,) = await client.discover()
            policy = info.status.policy
            session = await client.open_session(info, features=policy.features, fps=policy.fps)
            state, images = np.zeros(6, np.float32), {"front": np.zeros((8, 8, 3), np.uint8)}
            for n in range(-WARMUP, REQUESTS + 1):
                if n >= 0 and n % SAMPLE_EVERY == 0:
                    server_rss.sample(n)
                    client_rss.sample(n)
                if n < REQUESTS:
                    result = await session.infer(state, images, timeout=5)
            assert result.chunk_robot.shape == (2, 6)
            assert session.stats.chunks == WARMUP + REQUESTS
            assert session.stats.encode.count() == ENCODE_WINDOW  # full, and no bigger
            await session.close()
    finally:
        await anyio.to_thread.run_sync(server.stop)
    print(f"\n{REQUESTS} requests in {time.monotonic() - started:.0f} s\n{server_rss.report()}\n{client_rss.report()}")
    server_rss.assert_flat()
    client_rss.assert_flat()


async def test_edge_loop_memory_stays_flat() -> None:
    robot = RobotDescription("sim", {"fps": EDGE_FPS, "cameras": "none"})
    # Append merge, one-step chunks, a new request whenever the queue is empty: about one request
    # per control tick.
    config = EdgeConfig(
        pipeline=PipelineConfig(rtc=False, buffer_time_s=1 / EDGE_FPS),
        control=ControlConfig(max_action_age_s=60.0),
        failsafe=FailSafeConfig(degraded_after_s=60.0),
    )
    engine = EchoEngine(config, robot.spec())  # the engine loop, the network cut out
    runtime = EdgeRuntime(robot, engine, config, RunOptions(realtime=False, park_timeout_s=1.0))
    edge_rss = RssLog("edge")
    control_rss = RssLog("control process")
    started = time.monotonic()

    async def sample_then_stop() -> None:
        mark = 0
        # The requests counter is written by the engine on this loop; sampled on its own beat.
        while engine.requests < WARMUP + REQUESTS:
            if engine.requests - WARMUP >= mark:
                assert isinstance(runtime.loop, ProcessControlLoop)
                control_rss.pid = runtime.loop.pid
                edge_rss.sample(engine.requests - WARMUP)
                control_rss.sample(engine.requests - WARMUP)
                mark += SAMPLE_EVERY
            await anyio.sleep(0.01)
        edge_rss.sample(engine.requests - WARMUP)
        control_rss.sample(engine.requests - WARMUP)
        runtime.request_stop("soak done")

    async with anyio.create_task_group() as tg:
        tg.start_soon(sample_then_stop)
        summary = await runtime.run()
    loop = runtime.loop
    assert loop is not None
    print(
        f"\nedge: {engine.requests} requests, {summary.ticks} ticks in {time.monotonic() - started:.0f} s, "
        f"final state {summary.final_state}\n{edge_rss.report()}\n{control_rss.report()}"
    )
    assert summary.chunks_received >= WARMUP + REQUESTS
    # The summary's statistics are a fixed histogram and full windows, whatever the uptime.
    lateness = loop.channel.lateness_counts()
    assert len(lateness) == LATENESS_BINS
    assert int(lateness.sum()) == summary.ticks
    assert engine.rtt.count() == engine.rtt.window < summary.chunks_received
    assert summary.tick_jitter_ms["max"] is not None
    assert len(engine.failsafe.transitions) <= MAX_TRANSITIONS
    edge_rss.assert_flat()
    control_rss.assert_flat()
