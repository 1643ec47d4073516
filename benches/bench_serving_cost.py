"""Pure serving cost (issue 27 item 4): requests per second and server CPU per request, servo vs openpi.

A policy that takes no time (0 ms forward), N = 16 clients each in its own process, each with one
request in flight, sending two 480x640 camera frames + a 6-d state (+ a prompt for openpi), so
everything measured is serving: transport, authentication, decoding, scheduling and the reply.

- ``servo``: ``servo-serve``'s `PolicyServer` (``python -m benches._fleet serve``) over Zenoh TCP
  (``shared_memory = false``: what a robot reaching a GPU box uses), frames raw and JPEG q90,
  clients ``python -m benches._fleet client`` (a `PolicyClient` session each); its observation
  intake spread over one lane per core (`servo.server.lanes`), and on one thread as before
  (``servo 1 lane``, ``serving.intake_threads = 1``): the same-run before/after. ``servo, policy
  process`` is ``servo-serve``'s default layout: the policy in a process of its own
  (`servo.server.policy_process`), whose CPU counts with the server's.
- ``openpi``: the openpi protocol server of `benches._openpi` (``websockets`` + openpi-client's
  msgpack-numpy, the forward on the event loop, as openpi's ``WebsocketPolicyServer`` runs it;
  openpi's server package is not on PyPI, its client is), clients ``openpi_client``'s own
  ``WebsocketClientPolicy``. openpi sends frames raw only.

Per row: ``served_rps`` (replies received inside the window), ``server_cpu_us`` (the server
process's CPU time over the window, all threads and its policy process, per served request) and ``rps_per_core``
(= 1e6 / server_cpu_us: requests one core of server CPU serves), the caller's overhead p50 (its
wall clock around the request minus the server-reported forward), and the machine's load. On a
shared 2-core machine the clients compete with the server for the cores, so ``served_rps`` is
bounded by the whole machine and ``rps_per_core`` is the server's own cost.

Smoke (CI): ``pytest benches/bench_serving_cost.py --benchmark-disable`` (2 clients, 5 requests).
Measure: ``pytest benches/bench_serving_cost.py --benchmark-enable --benchmark-only`` (also writes
``benches/results/serving_cost.md``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from benches._cpu import CpuWatch
from benches._fleet import FleetResult, run_process_fleet, window
from benches._support import markdown, percentiles_ms, ready_process, results_table
from testbed.processes import free_port

pytestmark = pytest.mark.filterwarnings(
    # openpi-client 0.1.2 connects the way websockets >= 17.1 deprecates (its code, unchanged)
    "ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"
)

CLIENTS = 16
SMOKE_CLIENTS = 2
SMOKE_REQUESTS = 5
WARMUP_S = 3.0
MEASURE_S = 8.0
#: Servers (their ``benches._fleet serve`` flags): servo with its observation intake on one thread
#: (before issue 27), with a lane per core (``serving.intake_threads = 0``), and with the policy in
#: a process of its own as well (servo-serve's default); and the openpi-protocol server.
SERVERS: dict[str, tuple[str, ...] | None] = {
    "servo 1 lane": ("--intake-threads", "1"),
    "servo": ("--intake-threads", "0"),
    "servo, policy process": ("--intake-threads", "0", "--process", "separate"),
    "openpi": None,
}
#: payload -> JPEG quality of the clients (0: raw); openpi's protocol sends frames raw only.
PAYLOADS = {"raw": 0, "jpeg90": 90}


@pytest.fixture(scope="module", params=list(SERVERS))
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, int, int]]:
    """(name, port, pid) of a server whose forward takes no time."""
    flags = SERVERS[request.param]
    if flags is not None:
        port = free_port()
        command = [sys.executable, "-m", "benches._fleet", "serve", "--port", str(port), "--transport", "tcp"]
        with ready_process([*command, "--compute-ms", "0", *flags], "servo server") as (proc, _):
            yield request.param, port, proc.pid
    else:
        command = [sys.executable, "-m", "benches._openpi", "baseline", "--compute-ms", "0"]
        with ready_process(command, "openpi-protocol server") as (proc, line):
            yield "openpi", int(line[1]), proc.pid


@pytest.fixture(scope="module")
def table(request: pytest.FixtureRequest) -> Iterator[list[dict[str, Any]]]:
    yield from results_table(request, render, "serving_cost.md")


class ServerCpu:
    """The server's CPU seconds between two monotonic instants, its child processes' included
    (sampled on its own thread)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seconds: float | None = None
        self._thread: threading.Thread | None = None

    def window(self, start: float, end: float) -> None:
        def sample() -> None:
            time.sleep(max(0.0, start - time.monotonic()))
            pids = [self.pid, *_children(self.pid)]  # the policy process starts before the server serves
            before = sum(CpuWatch.process_jiffies(pid) for pid in pids)
            time.sleep(max(0.0, end - time.monotonic()))
            after = sum(CpuWatch.process_jiffies(pid) for pid in pids)
            self.seconds = (after - before) / os.sysconf("SC_CLK_TCK")

        if end != float("inf"):
            self._thread = threading.Thread(target=sample, daemon=True)
            self._thread.start()

    def join(self) -> float | None:
        if self._thread is not None:
            self._thread.join(10)
        return self.seconds


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def summarize(result: FleetResult, cpu_s: float | None, smoke: bool) -> dict[str, Any]:
    s = result.samples
    served = len(s) if result.window_s else max(0, len(s) - result.n_clients)
    if result.window_s:
        span = result.window_s
    else:
        times = sorted(x.t_done for x in s)
        span = times[-1] - times[0] if len(times) > 1 else float("nan")
    rps = served / span if span and span > 0 else float("nan")
    cpu_us = cpu_s / served * 1e6 if cpu_s is not None and served else None
    c50, c99 = percentiles_ms([x.await_ms - x.inference_ms for x in s], (0.5, 0.99))
    return {
        "clients": result.n_clients,
        "samples": len(s),
        "served_rps": round(rps, 1),
        "server_cpu_us": round(cpu_us, 1) if cpu_us is not None else None,
        "rps_per_core": round(1e6 / cpu_us, 1) if cpu_us else None,
        "server_cores": round(cpu_s / span, 2) if cpu_s is not None and result.window_s else None,
        "caller_overhead_ms_p50": round(c50, 2),
        "caller_overhead_ms_p99": round(c99, 2),
        "load": round(os.getloadavg()[0], 1),
        "errors": result.errors[:5],
        "correct": bool(s) and all(x.ok for x in s) and not result.errors,
        "smoke": smoke,
    }


def render(rows: list[dict[str, Any]]) -> str:
    mode = "smoke (--benchmark-disable)" if rows[0]["smoke"] else f"{MEASURE_S:g} s window after {WARMUP_S:g} s"
    title = (
        f"Pure serving cost: 0 ms policy, N = {rows[0]['clients']} client processes, two 480x640 frames + "
        f"state, one request in flight each; {mode}; server in its own process on 127.0.0.1 (servo: Zenoh "
        "TCP, shared_memory = false; openpi: WebSocket + msgpack-numpy). server CPU = the server process's "
        "(and its policy process's) user + system time over the window per served request; requests/s per "
        "core = 1e6 / that; "
        "caller overhead = the client's wall clock per request - the server-reported forward. "
        "load = 1-min load average at the row's end (the machine has "
        f"{os.cpu_count()} cores, shared with the clients and other work)."
    )
    header = [
        "server",
        "payload",
        "served req/s",
        "server CPU µs / req",
        "req/s per server core",
        "server cores busy",
        "caller overhead p50 / p99 ms",
        "load",
        "ok",
    ]
    body = [
        [
            r["server"],
            r["payload"],
            r["served_rps"],
            r["server_cpu_us"] if r["server_cpu_us"] is not None else "-",
            r["rps_per_core"] if r["rps_per_core"] is not None else "-",
            r["server_cores"] if r["server_cores"] is not None else "-",
            f"{r['caller_overhead_ms_p50']:.2f} / {r['caller_overhead_ms_p99']:.2f}",
            r["load"],
            r["correct"],
        ]
        for r in rows
    ]
    text = markdown(title, header, body)
    per_core = {(r["server"], r["payload"]): r["rps_per_core"] for r in rows if r["rps_per_core"]}
    openpi = per_core.get(("openpi", "raw"))
    if openpi:
        ratios = [f"{name} {payload} {v / openpi:.2f}x" for (name, payload), v in per_core.items() if name != "openpi"]
        text += f"\n\nservo's requests/s per server core against openpi's: {', '.join(ratios)} (target >= 2x)."
    return text


@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_serving_cost(
    benchmark: BenchmarkFixture, server: tuple[str, int, int], table: list[dict[str, Any]], payload: str
) -> None:
    name, port, pid = server
    if name == "openpi" and payload != "raw":
        pytest.skip("openpi's protocol sends frames raw")
    smoke = benchmark.disabled
    n = SMOKE_CLIENTS if smoke else CLIENTS
    cpu = ServerCpu(pid)
    client = "benches._openpi" if name == "openpi" else "benches._fleet"
    kwargs = window(smoke, smoke_requests=SMOKE_REQUESTS, warmup_s=WARMUP_S, measure_s=MEASURE_S)
    benchmark.group = "serving-cost"
    benchmark.name = f"{name}-{payload}-N{n}"
    result = benchmark.pedantic(
        lambda: run_process_fleet(port, n, quality=PAYLOADS[payload], client=client, on_window=cpu.window, **kwargs),
        rounds=1,
        iterations=1,
    )
    stats = summarize(result, cpu.join(), smoke)
    benchmark.extra_info.update(stats, server=name, payload=payload)
    table.append({**stats, "server": name, "payload": payload})
    assert stats["correct"], stats
