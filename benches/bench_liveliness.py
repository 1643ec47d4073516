"""Liveliness that tells a busy server from a dead one (issue 30): false losses of a streaming robot at load.

``servo-serve`` (reference policy, two 480x640 cameras, 20 ms forwards) and ``servo-edge``
driving the simulated arm (default options), Zenoh over TCP on 127.0.0.1, for
``LIVELINESS_BENCH_SECONDS`` (600) beside ``LIVELINESS_BENCH_HOGS`` (20) busy loops of the bench's
own (`testbed.load`; plus whatever else the machine runs: the load average is in the table). The
server never stops, so every reconnect in the edge's recording is a false loss, whatever it gives
as the reason (a link that expired shows as ``server liveliness lost``, or as observations that
found no subscriber when the edge's send noticed first). With ``LIVELINESS_BENCH_BASELINE=PATH`` a
second server and edge run side by side with PATH first on ``PYTHONPATH`` (e.g. another checkout's
``python/``), under the same load.

How fast a real death is noticed (kill -9, SIGSTOP): benches/bench_failover.py. Smoke
(``--benchmark-disable``): 10 s, no hogs. Measure::

    LIVELINESS_BENCH_BASELINE=/path/to/main/python \\
        pytest -q -s benches/bench_liveliness.py --benchmark-enable --benchmark-only

(writes ``benches/results/liveliness.md``).
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from benches._edge_cli import EdgeRun, run_edge
from benches._edge_rig import ServerProcess
from benches._support import markdown, publish
from servo.transport import DEFAULT_LEASE_MS
from testbed.load import CpuHogs
from testbed.processes import free_port

SECONDS = float(os.environ.get("LIVELINESS_BENCH_SECONDS", "600"))
HOGS = int(os.environ.get("LIVELINESS_BENCH_HOGS", "20"))
BASELINE = os.environ.get("LIVELINESS_BENCH_BASELINE", "")
#: Zenoh lease (ms) of both ends, server and edge (unset: their defaults).
LEASE_MS = os.environ.get("LIVELINESS_BENCH_LEASE_MS", "")
SMOKE_SECONDS = 10.0
#: How often the load average is sampled while the edges run (s).
LOAD_EVERY_S = 10.0


def _env(pythonpath: str | None) -> dict[str, str] | None:
    """The environment of one side's processes: ``pythonpath`` first on their path, if given."""
    return None if pythonpath is None else {"PYTHONPATH": os.pathsep.join([pythonpath, os.environ["PYTHONPATH"]])}


def render(rows: list[dict[str, Any]], seconds: float, hogs: int, load: list[float]) -> str:
    lease = f"{LEASE_MS} ms" if LEASE_MS else f"each code's default (this tree: {DEFAULT_LEASE_MS} ms)"
    title = (
        f"A streaming robot (servo-edge, sim arm, 2 x 480x640 cameras, default options) on servo-serve (reference "
        f"policy, 20 ms forwards), Zenoh TCP on 127.0.0.1, {seconds:g} s beside {hogs} busy loops of the bench's "
        f"own on {os.cpu_count()} cores; Zenoh lease {lease}; 1-min load average "
        f"{min(load):.1f}-{max(load):.1f} (mean {sum(load) / len(load):.1f}). The server never stops: every "
        "reconnect is a false loss (the link expired: 'server liveliness lost', or the observations found no "
        "subscriber first)."
    )
    header = ["code", "false losses (reconnects, why)", "requests", "timeouts", "fresh ticks"]
    header.append("longest gap s")
    cells = []
    for r in rows:
        why = ", ".join(f"{reason}: {n}" for reason, n in r["reasons"].items())
        cells.append(
            [
                r["code"],
                f"{r['reconnects']} ({why})" if why else r["reconnects"],
                r["requests"],
                r["timeouts"],
                f"{100 * r['fresh_share']:.1f} %",
                f"{r['longest_gap_s']:.2f}",
            ]
        )
    return markdown(title, header, cells)


@pytest.mark.timeout(3600)
def test_no_false_liveliness_losses_at_load(benchmark: BenchmarkFixture, tmp_path: Path, request: Any) -> None:
    smoke = benchmark.disabled
    seconds, hogs = (SMOKE_SECONDS, 0) if smoke else (SECONDS, HOGS)
    codes: dict[str, str | None] = {"this tree": None}
    if BASELINE and not smoke:
        codes[f"baseline ({BASELINE})"] = BASELINE
    load: list[float] = []
    done = threading.Event()

    def run() -> dict[str, EdgeRun]:
        with contextlib.ExitStack() as stack:
            # The servers start (load torch, warm up) before the load does: at load 20 that alone
            # outlasts the harness's patience, and the run is about a robot streaming.
            ports = {}
            for i, (code, path) in enumerate(codes.items()):
                workdir = tmp_path / f"run{i}"
                workdir.mkdir()
                ports[code] = (workdir, free_port())
                zenoh = f"lease_ms = {LEASE_MS}" if LEASE_MS else ""
                stack.enter_context(ServerProcess(workdir, ports[code][1], zenoh=zenoh, env=_env(path)))
            stack.enter_context(CpuHogs(hogs))
            pool = stack.enter_context(ThreadPoolExecutor(len(codes)))
            edge = ["--lease-ms", LEASE_MS] if LEASE_MS else []
            futures = {
                code: pool.submit(
                    run_edge, ports[code][0], f"tcp/127.0.0.1:{ports[code][1]}", seconds, options=edge, env=_env(path)
                )
                for code, path in codes.items()
            }
            while not done.wait(LOAD_EVERY_S if not smoke else 1.0):
                load.append(os.getloadavg()[0])
                if all(f.done() for f in futures.values()):
                    done.set()
            return {code: f.result() for code, f in futures.items()}

    benchmark.group = "liveliness"
    runs = benchmark.pedantic(run, rounds=1, iterations=1)
    rows = [{"code": code, **edge.row()} for code, edge in runs.items()]
    benchmark.extra_info.update(rows=rows, load=load, hogs=hogs)
    publish(request, render(rows, seconds, hogs, load or [os.getloadavg()[0]]), "liveliness.md", smoke=smoke)
    for row in rows:
        assert row["ticks"] > 0, row
