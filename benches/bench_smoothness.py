"""Smoothness under latency (issue 5): sync vs rtc vs remote at 0/50/150/300 ms.

``pytest benches/bench_smoothness.py --benchmark-only`` runs the full study (about 3 minutes)
and writes ``benches/results/smoothness.{md,json,png}``; under ``--benchmark-disable`` (CI) one
short run per engine checks that the harness works.
"""

from __future__ import annotations

from dataclasses import asdict

import anyio
import numpy as np
from pytest_benchmark.fixture import BenchmarkFixture

from benches.smoothness import ENGINES, RunResult, run_one, study, write_results


def _quick() -> tuple[list[RunResult], dict[tuple[str, int], np.ndarray]]:
    results, traces = [], {}
    for engine in ENGINES:
        result, trace = anyio.run(
            lambda e=engine: run_one(e, 50, duration_s=1.0, cap_s=4.0),  # type: ignore[misc]
            backend="asyncio",
            backend_options={"use_uvloop": True},
        )
        results.append(result)
        traces[(engine, 50)] = trace
    return results, traces


def _full() -> tuple[list[RunResult], dict[tuple[str, int], np.ndarray]]:
    return anyio.run(study, backend="asyncio", backend_options={"use_uvloop": True})


def test_smoothness_study(benchmark: BenchmarkFixture) -> None:
    # Under --benchmark-disable (CI smoke) one short run per engine checks the harness.
    results, traces = benchmark.pedantic(_quick if benchmark.disabled else _full, rounds=1, iterations=1)
    assert all(r.finish_s is not None for r in results), results
    benchmark.extra_info["runs"] = [asdict(r) for r in results]
    if benchmark.disabled:
        return
    write_results(results, traces)
    by = {(r.engine, r.latency_ms): r for r in results}
    # The claim the study backs: with 300 ms of inference, async engines keep time, sync falls behind.
    benchmark.extra_info["correct"] = (
        by[("rtc", 300)].rms_error < by[("sync", 300)].rms_error
        and by[("remote", 300)].stalled_s < by[("sync", 300)].stalled_s
    )
