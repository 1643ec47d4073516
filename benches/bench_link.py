"""The link-aware codec on a 100 Mbit/s link (issue 10): raw, JPEG q90 and ``auto`` in one run.

The server (``python -m benches._fleet serve``, 20 ms compute, two 480x640 cameras) runs in a
network namespace behind a veth shaped to 100 Mbit/s both ways (`testbed.netns`, shared memory
off: TCP through the shaped link); one client in this process sends camera-like frames
(`benches._fleet.frames`). The three modes run interleaved, ``ROUNDS`` times A B C, each round a
new session (so ``auto`` starts from nothing every time and its start-up probes of raw fall in
the warm-up), and are reported as:

* ``rtt_ms``: observation stamp -> chunk received (client encode, transfer both ways, server
  decode and the 20 ms forward), p50 / p99 over every round's window;
* ``overhead_ms``: the same minus the server-reported inference time;
* for ``auto``: what it chose (codec requests by option) and the link it measured.

Done when (issue 10): ``auto`` rtt p50 and p99 each <= 1.1 x the better of raw and JPEG q90
(at p99 because ``auto`` postpones its re-probes of raw while raw is hopeless). Needs root
(``ip netns``, ``tc``); skipped otherwise. Smoke (``--benchmark-disable``): 6 requests per
mode, no timing claims. Measure: ``pytest benches/bench_link.py --benchmark-enable
--benchmark-only`` (writes ``benches/results/link_codec.md``).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any, Literal

import anyio
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from benches._fleet import FleetResult, Sample, run_fleet, window
from benches._support import percentiles_ms, publish, ready_process
from testbed import netns
from testbed.processes import free_port

pytestmark = pytest.mark.skipif(not netns.available(), reason="needs root, ip and tc (network namespace + tbf)")

RATE_MBIT = 100
COMPUTE_MS = 20.0
ROUNDS = 3
WARMUP_S = 3.0
MEASURE_S = 6.0
SMOKE_REQUESTS = 6
MODES: dict[str, int | Literal["auto"]] = {"raw": 0, "jpeg90": 90, "auto": "auto"}


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, int]]:
    """The bench server in a namespace behind the shaped link; yields its address and port."""
    with netns.shaped_link(RATE_MBIT) as link:
        port = free_port()
        command = [
            *("ip", "netns", "exec", link.namespace, sys.executable, "-m", "benches._fleet", "serve"),
            *("--host", link.server_ip, "--port", str(port), "--compute-ms", str(COMPUTE_MS), "--transport", "tcp"),
        ]
        with ready_process(command, "server in the namespace", check=False):
            yield link.server_ip, port


def _run(host: str, port: int, quality: int | Literal["auto"], smoke: bool) -> FleetResult:
    kwargs = window(smoke, smoke_requests=SMOKE_REQUESTS, warmup_s=WARMUP_S, measure_s=MEASURE_S)
    result: FleetResult = anyio.run(
        lambda: run_fleet(port, 1, quality=quality, transport="tcp", host=host, **kwargs),
        backend="asyncio",
        backend_options={"use_uvloop": True},
    )
    return result


def _summary(samples: list[Sample], results: list[FleetResult]) -> dict[str, Any]:
    r50, r99 = percentiles_ms([s.rtt_ms for s in samples], (0.5, 0.99))
    o50, o99 = percentiles_ms([s.rtt_ms - s.inference_ms for s in samples], (0.5, 0.99))
    used: Counter[str] = Counter()
    links = []
    for result in results:
        for status in result.codec:
            used.update(status.requests)
            if status.link_mbps is not None:
                links.append(round(status.link_mbps, 1))
    return {
        "samples": len(samples),
        "rtt_ms_p50": round(r50, 2),
        "rtt_ms_p99": round(r99, 2),
        "overhead_ms_p50": round(o50, 2),
        "overhead_ms_p99": round(o99, 2),
        "codec_requests": dict(used),
        "final_codec": [status.current for result in results for status in result.codec],
        "link_mbps": links,
        "errors": [e for result in results for e in result.errors][:5],
    }


def render(rows: dict[str, dict[str, Any]], smoke: bool) -> str:
    lines = [
        "| mode | rtt p50 / p99 ms | overhead p50 / p99 ms | requests by codec | chosen at the end | link Mbit/s |",
        "|---|---|---|---|---|---|",
    ]
    for mode, r in rows.items():
        lines.append(
            f"| {mode} | {r['rtt_ms_p50']:.1f} / {r['rtt_ms_p99']:.1f} | {r['overhead_ms_p50']:.1f} / "
            f"{r['overhead_ms_p99']:.1f} | {r['codec_requests']} | {', '.join(r['final_codec'])} | "
            f"{', '.join(map(str, r['link_mbps'])) or '-'} |"
        )
    window = "smoke" if smoke else f"{ROUNDS} interleaved rounds of {MEASURE_S:g} s after {WARMUP_S:g} s warm-up"
    lines.append(
        f"\nTCP through a veth shaped to {RATE_MBIT} Mbit/s (tc tbf) both ways, server in a network namespace; "
        f"N = 1, two 480x640 camera-like frames, {COMPUTE_MS:g} ms compute; {window}. rtt = observation stamp -> "
        "chunk received (client encode included); overhead = rtt - server-reported inference."
    )
    return "\n".join(lines)


def test_codec_on_a_100_mbit_link(
    request: pytest.FixtureRequest, benchmark: BenchmarkFixture, server: tuple[str, int]
) -> None:
    smoke = benchmark.disabled
    host, port = server
    results: dict[str, list[FleetResult]] = {mode: [] for mode in MODES}

    def run_all() -> None:
        for _ in range(1 if smoke else ROUNDS):
            for mode, quality in MODES.items():
                results[mode].append(_run(host, port, quality, smoke))

    benchmark.group = "link-100mbit"
    benchmark.name = "codec-raw-jpeg90-auto"
    benchmark.pedantic(run_all, rounds=1, iterations=1)
    rows = {mode: _summary([s for r in rs for s in r.samples], rs) for mode, rs in results.items()}
    benchmark.extra_info.update(rows, rate_mbit=RATE_MBIT, compute_ms=COMPUTE_MS)
    for mode, row in rows.items():
        assert row["samples"], (mode, row)
        assert not row["errors"], (mode, row)
    publish(request, render(rows, smoke), "link_codec.md", smoke=smoke)
    if smoke:
        return
    for stat in ("rtt_ms_p50", "rtt_ms_p99"):
        best = min(rows["raw"][stat], rows["jpeg90"][stat])
        assert rows["auto"][stat] <= 1.1 * best, (stat, rows)
