"""Send on time (issue 19 item 1): a policy slower than ``buffer_time_s`` never lets the queue run dry.

``servo-serve`` in another process serves the reference policy padded to 700 ms per forward
(50-step chunks, 1.67 s at 30 fps: long enough for one request in flight, if it leaves early
enough); the edge (`RemoteEngine` + `EdgeRuntime`, default options, the sim arm with two
480x640 cameras, TCP over 127.0.0.1 with shared memory on, servo's default) streams from it.
Designs, same run, same server:

* ``servo`` — the trigger of `ChunkPipeline.send_below`: the next observation leaves when the
  queue would run dry before the expected chunk is back (round trip + 25 %, at least + 50 ms),
  at the latest under ``buffer_time_s``.
* ``buffer-only`` — the baseline, servo's trigger before: the queue under ``buffer_time_s``
  (0.5 s), whatever the round trip.

Counted from the first merged chunk on (before it the queue is empty by definition): fallback
ticks (the control loop had no fresh action: the queue ran dry), their share of all ticks, and
the DEGRADED / STALLED transitions.

Smoke (CI): ``pytest benches/bench_send_on_time.py --benchmark-disable`` (one 4 s run per design).
Measure::

    pytest benches/bench_send_on_time.py --benchmark-enable --benchmark-only -s

``SEND_BENCH_S`` seconds per design (default 20). Target: ``servo`` has 0 fallback ticks.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from benches._edge_rig import ServerProcess
from benches._support import markdown, results_table
from servo.edge.config import load_edge_config
from servo.edge.pipeline import ChunkPipeline
from servo.edge.remote import RemoteEngine
from servo.edge.runtime import EdgeRuntime, RunOptions
from servo.logs import configure_logging
from servo.robots import RobotDescription
from testbed.processes import free_port

COMPUTE_MS = 700.0
DESIGNS = ("servo", "buffer-only")


class BufferOnly(ChunkPipeline):
    """The baseline trigger: the queue under ``buffer_time_s``, whatever the round trip."""

    def send_below(self) -> int:
        return math.ceil(self.buffer_steps)


def render(rows: list[dict[str, Any]]) -> str:
    title = (
        f"Send on time: reference policy padded to {COMPUTE_MS:g} ms per forward, 50-step chunks at 30 fps, "
        "default edge options, TCP on 127.0.0.1 with shared memory; counted from the first chunk "
        f"(machine load {os.getloadavg()[0]:.1f})."
    )
    header = ["design", "s", "ticks", "fallback ticks", "held", "DEGRADED", "STALLED", "chunks", "rtt p50 ms"]
    return markdown(title, header, [_cells(r) for r in rows])


def _cells(r: dict[str, Any]) -> list[object]:
    return [
        r["design"],
        f"{r['seconds']:.1f}",
        r["ticks"],
        r["fallback_ticks"],
        f"{r['held_pct']:.1f} %",
        r["degraded"],
        r["stalled"],
        r["chunks"],
        f"{r['rtt_ms_p50']:.0f}",
    ]


@pytest.fixture(scope="module")
def table(request: pytest.FixtureRequest) -> Iterator[list[dict[str, Any]]]:
    yield from results_table(request, render, "send_on_time.md")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    configure_logging("warning")
    with ServerProcess(Path(tmp_path_factory.mktemp("send-bench")), free_port(), compute_ms=COMPUTE_MS) as proc:
        yield proc


async def run_design(server: ServerProcess, design: str, seconds: float) -> dict[str, Any]:
    robot = RobotDescription("sim", {})
    config = load_edge_config(flags={"connect": [f"tcp/127.0.0.1:{server.port}"], "jpeg_quality": 90})
    engine = RemoteEngine(config, robot.spec())
    if design == "buffer-only":
        engine.pipeline = BufferOnly(robot.spec().action_dim, robot.spec().fps, config.pipeline, config.control)
    runtime = EdgeRuntime(robot, engine, config, RunOptions(park_timeout_s=1.0))
    result: dict[str, Any] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.run)
        with anyio.fail_after(60):
            while engine.chunks_received < 1 or runtime.loop is None:  # noqa: ASYNC110 - counters only
                await anyio.sleep(0.01)
        loop = runtime.loop
        start_ticks, start_fallback = loop.statistics().ticks, engine.pipeline.fallback_ticks
        start_transitions, start_chunks = engine.failsafe.transition_count, engine.chunks_received
        await anyio.sleep(seconds)
        ticks = loop.statistics().ticks - start_ticks
        fallback = engine.pipeline.fallback_ticks - start_fallback
        states = [t.state.value for t in engine.failsafe.transitions_since(start_transitions)]
        rtt_ns = engine.pipeline.latency.percentile(0.5) or 0
        result = {
            "design": design,
            "seconds": seconds,
            "ticks": ticks,
            "fallback_ticks": fallback,
            "held_pct": 100.0 * fallback / max(1, ticks),
            "degraded": states.count("degraded"),
            "stalled": states.count("stalled"),
            "chunks": engine.chunks_received - start_chunks,
            "rtt_ms_p50": rtt_ns / 1e6,
            "starving": engine.statistics().starving,
        }
        runtime.request_stop("bench done")
    return result


@pytest.mark.parametrize("design", DESIGNS)
def test_send_on_time(
    benchmark: BenchmarkFixture, server: ServerProcess, table: list[dict[str, Any]], design: str
) -> None:
    benchmark.group = "send on time"
    seconds = 4.0 if benchmark.disabled else float(os.environ.get("SEND_BENCH_S", "20"))

    def run() -> dict[str, Any]:
        return anyio.run(run_design, server, design, seconds, backend="asyncio", backend_options={"use_uvloop": True})

    row = benchmark.pedantic(run, rounds=1, iterations=1)
    table.append({**row, "smoke": benchmark.disabled})
    benchmark.extra_info.update(row)
    benchmark.extra_info["correct"] = bool(row["chunks"] > 0 and row["ticks"] > 0 and not row["starving"])
    if design == "servo":
        benchmark.extra_info["target_met"] = row["fallback_ticks"] == 0
    assert row["chunks"] > 0
