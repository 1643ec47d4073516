"""Where a round trip's time goes: one robot's request through each of servo's stages (issue 27).

Smoke test: ``pytest benches/bench_stages.py --benchmark-disable``.
Measure: ``pytest benches/bench_stages.py --benchmark-enable --benchmark-only`` (writes
``benches/results/stages.md``).

One client in this process (`benches._fleet.run_fleet`, N = 1, two raw 480x640 frames, Zenoh TCP
with shared memory off) and a server in its own (``benches._fleet serve``, a 20 ms forward, the
policy in the server's process), each function a stage starts or ends in stamped with the host's
monotonic clock (`benches._stage_marks`: servo's own functions, wrapped from outside). Per stage:
p50 and p90 over the requests of the window, in µs. The stamps cost about a microsecond each;
"the forward" is the server's own time, every other stage is overhead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from benches import _stage_marks
from benches._fleet import run_fleet, window
from benches._support import markdown, percentiles_ms, ready_process, results_table
from testbed.processes import free_port

COMPUTE_MS = 20.0
#: (first mark, next mark, what happens between them), in the order a request goes. Each mark
#: happens after the one before it whatever the scheduling: a put may return after the server
#: has the observation, and the worker may take it before its lane returns from the deposit.
STAGES = [
    ("infer called", "uplink thread", "client: the event loop builds the request, the uplink thread takes it"),
    ("uplink thread", "packed", "client: the frames packed into one message"),
    ("packed", "server callback thread", "client: sealed (AES-256-GCM) and put; Zenoh to the server's callback"),
    ("server callback thread", "intake lane", "server: routed to the session's intake lane"),
    ("intake lane", "verified", "server: copied out of Zenoh and opened"),
    ("verified", "decoded", "server: admitted and decoded"),
    ("decoded", "worker took it", "server: deposited in the session's mailbox; the worker wakes and takes it"),
    ("worker took it", "forward done", "server: the forward (the server's own time, not overhead)"),
    ("forward done", "answer sealed and put", "server: the answer built"),
    ("answer sealed and put", "answer on callback thread", "sealed, put, through Zenoh to the client's callback"),
    ("answer on callback thread", "answer on event loop", "client: handed to the event loop"),
    ("answer on event loop", "infer returned", "client: opened, checked, returned to the caller"),
]


@pytest.fixture(scope="module")
def table(request: pytest.FixtureRequest) -> Iterator[list[dict[str, Any]]]:
    yield from results_table(request, render, "stages.md")


def render(rows: list[dict[str, Any]]) -> str:
    (row,) = rows
    return markdown(
        f"One robot's round trip through servo, stage by stage ({row['requests']} requests, N = 1, two raw "
        f"480x640 frames + state, {COMPUTE_MS:g} ms forward, Zenoh TCP on 127.0.0.1 with shared memory off, "
        "the policy in the server's process; `pytest benches/bench_stages.py --benchmark-enable "
        f"--benchmark-only`, {os.cpu_count()} cores, load {row['load']:.1f}). Overhead = the round trip less "
        f"the forward: p50 {row['overhead_p50']:.0f} µs.",
        ["stage", "p50 µs", "p90 µs"],
        [(what, f"{p50:.0f}", f"{p90:.0f}") for what, p50, p90 in row["stages"]],
    )


def requests(events: list[tuple[str, int]]) -> list[dict[str, int]]:
    """Each request's first stamp of every mark, from its ``infer called`` to the next one's."""
    out: list[dict[str, int]] = []
    for name, at in sorted(events, key=lambda e: e[1]):
        if name == "infer called":
            out.append({})
        if out and name not in out[-1]:
            out[-1][name] = at
    marks = {m for stage in STAGES for m in stage[:2]}
    return [r for r in out if marks <= set(r)]


@pytest.mark.timeout(300)
def test_stages(
    benchmark: BenchmarkFixture, table: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    smoke = benchmark.disabled
    events_file, port = tmp_path / "server-events", free_port()
    command = [sys.executable, "-m", "benches._stage_marks", str(events_file), "--port", str(port)]
    command += ["--compute-ms", str(COMPUTE_MS), "--transport", "tcp"]
    _stage_marks.install_client(monkeypatch)
    kwargs = window(smoke, smoke_requests=8, warmup_s=1.0, measure_s=6.0)
    with ready_process(command, "stamped server"):
        result = benchmark.pedantic(
            lambda: anyio.run(
                lambda: run_fleet(port, 1, quality=0, transport="tcp", **kwargs),
                backend="asyncio",
                backend_options={"use_uvloop": True},
            ),
            rounds=1,
            iterations=1,
        )
    server = [(line.rsplit(" ", 1)[0], int(line.rsplit(" ", 1)[1])) for line in events_file.read_text().splitlines()]
    done = requests(_stage_marks.EVENTS + server)[2:]  # the first ones warm up
    assert len(done) >= min(5, len(result.samples) - 2), f"{len(done)} stamped requests of {len(result.samples)}"
    stages = []
    for first, then, what in STAGES:
        took_us = [(r[then] - r[first]) / 1e3 for r in done]
        assert min(took_us) >= 0, f"{what}: stamps out of order"  # every stamp is its own request's
        p50, p90 = percentiles_ms(took_us, [0.5, 0.9])
        stages.append((what, p50, p90))
    overhead = [(r["infer returned"] - r["infer called"] - r["forward done"] + r["worker took it"]) / 1e3 for r in done]
    table.append(
        {
            "stages": stages,
            "requests": len(done),
            "overhead_p50": float(np.median(overhead)),
            "load": os.getloadavg()[0],
            "smoke": smoke,
        }
    )
