"""Copies per 1,000 requests at load 20 (issue 30 item 4): servo before and after "resend only what was lost".

Processes (`benches._scale`): a Zenoh router, two replicas of a fixed-compute policy (one 48x64
camera, JPEG q80, forwards of `COMPUTE_MS`, as on a GPU: the load starves the threads around
them), one process of `ROBOTS` light robots asking `RATE_HZ`
times a second each (they send a copy when `RemoteSession.resend_after` says, as the edge does),
and 20 busy loops (`testbed.load.CpuHogs`) on the 2-core machine for the whole measurement.
After a warm-up, a window of `WINDOW_S`; at its middle the replica holding more sessions is
killed (kill -9) and its robots fail over to the survivor, whose queue then doubles: the moment
copies of merely late answers used to fire.

Run in `ROUNDS` pairs in one pytest run (``COPIES_ROUNDS``), the same driver and core:

* ``lost``: this tree's servo: copies flagged, answered by the server from the original, and made
  only once the answer is later than the replica's own account allows;
* ``today``: the servo of revision ``COPIES_BASELINE`` (default `BASELINE`, the commit before
  the change: a copy after three expected round trips, a second forward whenever the original
  was taken already), its Python under this build's core.

Per variant: requests asked, copies per 1,000 requests, second answers counted as expected,
answers refused as stale, timeouts, and the survivor's forwards per 1,000 answers it served (a
forward spent on a copy shows there). Measure::

    pytest benches/bench_copies.py --benchmark-enable --benchmark-only -s

Smoke (CI): ``--benchmark-disable`` runs each variant for a few seconds with no load.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pytest_benchmark.fixture import BenchmarkFixture

from benches.bench_scale import Child
from testbed.load import CpuHogs
from testbed.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
#: The last commit where a copy went out on every late answer and was served as a second forward.
BASELINE = "64f34ee1a485edfb56899e28b16429c1d7133c26"
ROBOTS = 20
RATE_HZ = 4.0
COMPUTE_MS = 10.0
WINDOW_S = 40.0
LOAD = 20
ROUNDS = int(os.environ.get("COPIES_ROUNDS", "3"))


def baseline_tree(workdir: Path) -> Path:
    """The baseline revision's ``python/`` tree with its own Rust core, built here (``git archive``, maturin).

    The core's wire and Python bindings have moved on since (the session cipher, the error tree), so
    today's core beside the old tree would not start. A release build takes a few minutes of CPU.
    """
    revision = os.environ.get("COPIES_BASELINE", BASELINE)
    tree = workdir / "baseline"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    if shutil.which("maturin") is None and importlib.util.find_spec("maturin") is None:
        pytest.skip("the baseline's core needs maturin to build (pip install maturin)")
    wheels = tree / "wheels"
    subprocess.run(
        [sys.executable, "-m", "maturin", "build", "--release", "--out", str(wheels), "-q"], cwd=tree, check=True
    )
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as built:
        (tree / "python" / "servo" / "_core.abi3.so").write_bytes(built.read("servo/_core.abi3.so"))
    return tree / "python"


def scrape(port: int, name: str, **labels: str) -> float:
    """One sample of a replica's /metrics (0 when absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def run_variant(workdir: Path, env: dict[str, str], window_s: float, load: int) -> dict[str, Any]:
    """One run of the scenario; the robots' totals and what the survivor served."""
    workdir.mkdir()
    router_port = free_port()
    health = {name: free_port() for name in ("r0", "r1")}
    out = workdir / "robots.json"
    children: list[Child] = []
    try:
        router = Child(workdir, "router", "router", "--port", str(router_port), env=env)
        children.append(router)
        router.wait_for("READY", 60)
        replicas = {}
        for name, port in health.items():
            args = [
                "serve",
                "--router",
                str(router_port),
                "--replica",
                name,
                "--compute-ms",
                str(COMPUTE_MS),
            ]
            replicas[name] = Child(workdir, name, *args, "--health-port", str(port), env=env)
            children.append(replicas[name])
        for child in replicas.values():
            child.wait_for("READY", 120)
        args = ["robots", "--router", str(router_port), "--count", str(ROBOTS), "--rate", str(RATE_HZ)]
        robots = Child(workdir, "robots", *args, "--out", str(out), env=env)
        children.append(robots)
        robots.wait_for("CONNECTED", 120)
        with CpuHogs(load):
            time.sleep(3.0)  # warm-up: every robot past its first request, the load settled
            time.sleep(window_s / 2)
            sessions = {name: scrape(port, "servo_active_sessions") for name, port in health.items()}
            victim = max(sessions, key=lambda name: sessions[name])
            survivor = next(name for name in health if name != victim)
            replicas[victim].proc.kill()
            time.sleep(window_s / 2)
            robots.stop()
            forwards = scrape(health[survivor], "servo_inference_ms_count")
            copies = {
                outcome: scrape(health[survivor], "servo_copies_total", outcome=outcome)
                for outcome in ("joined", "answered", "served")
            }
    finally:
        for child in reversed(children):
            child.stop()
    result = json.loads(out.read_text())
    answered_by_survivor = sum(1 for rows in result["served"].values() for row in rows if row[1] == survivor)
    totals = result["totals"]
    requests = max(1, totals["requests"])
    return {
        "requests": totals["requests"],
        "copies": totals["copies"],
        "copies_per_1000": round(1000 * totals["copies"] / requests, 1),
        "copy_answers_expected": totals["copy_answers"],
        "stale_refusals": totals["stale_refusals"],
        "timeouts": totals["timeouts"],
        "survivor_answers": answered_by_survivor,
        "survivor_forwards_per_1000_answers": round(1000 * forwards / max(1, answered_by_survivor), 1),
        "survivor_copies": copies,
        "sessions_at_kill": sessions,
    }


@pytest.mark.timeout(3600)
def test_copies_per_1000_requests_at_load_20(benchmark: BenchmarkFixture, tmp_path: Path) -> None:
    benchmark.group = "copies at load 20"
    window_s, load = (6.0, 0) if benchmark.disabled else (WINDOW_S, LOAD)
    # The smoke run (benchmarks disabled) runs today's rule only: building the baseline's core takes minutes.
    baseline = None if benchmark.disabled else {"PYTHONPATH": f"{baseline_tree(tmp_path)}{os.pathsep}{ROOT}"}

    def run() -> dict[str, Any]:
        rounds: dict[str, Any] = {}
        for n in range(1 if benchmark.disabled else ROUNDS):
            # Alternating, so that the machine's other load falls on both alike.
            if baseline is not None:
                rounds[f"today-{n}"] = run_variant(tmp_path / f"today-{n}", baseline, window_s, load)
            rounds[f"lost-{n}"] = run_variant(tmp_path / f"lost-{n}", {}, window_s, load)
        return rounds

    info = benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(info)
    print(f"\ncopies: {json.dumps(info)}")
    for variant in info.values():
        assert variant["requests"] > 0
        assert variant["survivor_answers"] > 0
