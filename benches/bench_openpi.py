"""openpi clients against servo's front door vs a minimal openpi-protocol server (issue 11).

The client is openpi's own (``openpi_client.websocket_client_policy.WebsocketClientPolicy`` from
PyPI, unchanged), one thread per client, each with one request in flight, sending the issue's
payload: two 480x640x3 uint8 frames, a 6-d state and a prompt; the policy answers a 50x6 chunk
after exactly 20 ms (ideal: 50 requests/s). The servers run in their own processes
(``benches/_openpi.py``):

- ``servo``: ``servo-serve``'s server with ``[frontends.openpi]``; every request travels WebSocket
  -> front door -> an in-process servo session -> the scheduler and inference worker -> back.
- ``openpi-protocol baseline``: the same protocol and mock policy in the fewest lines a server can
  have (``websockets`` + openpi's msgpack-numpy, the forward on the event loop as openpi's own
  ``WebsocketPolicyServer`` runs it): the floor of this protocol in Python, and what a user
  serving a policy the openpi way runs.

Per configuration: ``requests_per_s`` (completed requests over the window), ``overhead_ms`` p50 /
p99 = client round trip minus the server-reported forward time (``policy_timing.infer_ms``), so
it holds the client's msgpack encode, the transfer, decoding, scheduling and the reply; at N > 1
it also holds waiting for the other clients' forwards. Every reply is checked against the state
it was computed from (``correct``).

Smoke (CI): ``pytest benches/bench_openpi.py --benchmark-disable`` — 5 requests per client.
Measure: ``pytest benches/bench_openpi.py --benchmark-enable --benchmark-only
--benchmark-json=benches/results/raw/openpi.json`` (also writes ``benches/results/openpi.md``).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from pytest_benchmark.fixture import BenchmarkFixture

from benches._fleet import CAMERAS, HEIGHT, WIDTH
from benches._support import percentiles_ms, ready_process, results_table

pytestmark = pytest.mark.filterwarnings(
    # openpi-client 0.1.2 connects the way websockets >= 17.1 deprecates (its code, unchanged)
    "ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"
)

COMPUTE_MS = 20.0
IDEAL_RPS = 1000.0 / COMPUTE_MS
CLIENTS = (1, 4)
SMOKE_REQUESTS = 5
WARMUP_S = 1.0
MEASURE_S = 6.0
SERVERS = {"servo": "servo front door", "baseline": "openpi-protocol baseline"}


@pytest.fixture(scope="module", params=list(SERVERS))
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    command = [sys.executable, "-m", "benches._openpi", request.param, "--compute-ms", str(COMPUTE_MS)]
    with ready_process(command, f"{request.param} server") as (_, line):
        yield request.param, int(line[1])


@pytest.fixture(scope="module")
def table(request: pytest.FixtureRequest) -> Iterator[list[dict[str, Any]]]:
    yield from results_table(request, render, "openpi.md")


def _client(port: int, index: int, until: dict[str, float], smoke: bool, out: list[tuple[float, float, bool]]) -> None:
    rng = np.random.default_rng(index)
    frames = {name: rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8) for name in CAMERAS}
    policy = WebsocketClientPolicy("127.0.0.1", port)
    try:
        sent = 0
        while (sent < SMOKE_REQUESTS) if smoke else (time.monotonic() < until["end"]):
            state = np.full(6, float(index * 1000 + sent))
            obs = {"state": state, "images": frames, "prompt": "pick up the cube"}
            started = time.monotonic()
            reply = policy.infer(obs)
            done = time.monotonic()
            ok = reply["actions"].shape == (50, 6) and bool(np.allclose(reply["actions"][0], state))
            if smoke or until["start"] <= done:
                out.append((done, (done - started) * 1e3 - reply["policy_timing"]["infer_ms"], ok))
            sent += 1
    finally:
        policy._ws.close()


def _run(port: int, n_clients: int, smoke: bool) -> tuple[list[tuple[float, float, bool]], float]:
    start = time.monotonic() + (0 if smoke else WARMUP_S)
    until = {"start": start, "end": start + MEASURE_S}
    results: list[list[tuple[float, float, bool]]] = [[] for _ in range(n_clients)]
    threads = [
        threading.Thread(target=_client, args=(port, i, until, smoke, results[i]), daemon=True)
        for i in range(n_clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    samples = [s for r in results for s in r]
    times = sorted(s[0] for s in samples)
    window = MEASURE_S if not smoke else (times[-1] - times[0] if len(times) > 1 else float("nan"))
    return samples, window


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| server | N | requests/s | % ideal | overhead p50 / p99 ms | ok |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['server']} | {r['clients']} | {r['requests_per_s']:.1f} | {r['pct_of_ideal']:.1f} | "
            f"{r['overhead_ms_p50']:.2f} / {r['overhead_ms_p99']:.2f} | {r['correct']} |"
        )
    mode = "smoke (--benchmark-disable)" if rows[0]["smoke"] else f"{MEASURE_S:g} s windows after {WARMUP_S:g} s"
    lines.append(
        f"\nopenpi-client 0.1.2; two {HEIGHT}x{WIDTH}x3 uint8 frames + 6-d state + prompt, 50x6 chunk, "
        f"{COMPUTE_MS:g} ms compute (ideal {IDEAL_RPS:g}/s); {mode}. WebSocket on 127.0.0.1, server in its own "
        "process, one client thread each; requests/s = replies received inside the window; overhead = client "
        "round trip (msgpack encode included) - server-reported forward (policy_timing.infer_ms)."
    )
    return "\n".join(lines)


@pytest.mark.parametrize("n_clients", CLIENTS, ids=[f"N{n}" for n in CLIENTS])
def test_openpi_client(
    benchmark: BenchmarkFixture, server: tuple[str, int], table: list[dict[str, Any]], n_clients: int
) -> None:
    name, port = server
    smoke = benchmark.disabled
    benchmark.group = f"openpi-N{n_clients}"
    benchmark.name = f"{name}-N{n_clients}"
    samples, window = benchmark.pedantic(_run, args=(port, n_clients, smoke), rounds=1, iterations=1)
    served = len(samples) if not smoke else len(samples) - n_clients
    rps = served / window if window and window > 0 else float("nan")
    o50, o99 = percentiles_ms([s[1] for s in samples], (0.5, 0.99))
    stats = {
        "clients": n_clients,
        "samples": len(samples),
        "requests_per_s": round(rps, 2),
        "pct_of_ideal": round(100 * rps / IDEAL_RPS, 1),
        "overhead_ms_p50": round(o50, 3),
        "overhead_ms_p99": round(o99, 3),
        "correct": bool(samples) and all(s[2] for s in samples),
    }
    benchmark.extra_info.update(stats, server=name, compute_ms=COMPUTE_MS)
    table.append({**stats, "server": SERVERS[name], "smoke": smoke})
    assert stats["correct"], stats
