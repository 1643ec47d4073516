"""What watching a fleet costs (issue 21): server CPU and bytes per robot, against the same fleet unwatched.

The fleet of `bench_scale` (a router, three replicas of a fixed-compute policy, light robots of 50
per process at 0.5 requests/s each, Zenoh over TCP on 127.0.0.1 with shared memory on — the
default), run twice in one session, round after round:

* **baseline**: no telemetry, no monitor, no scrape, ``[ops] robot_metrics = 0`` (no per-robot series);
* **monitored**: every robot publishes its signed telemetry once a second (the edge's own record
  builder and signer), ``servo-monitor`` follows the fleet (telemetry, status every second, the
  replicas' refused requests every 5 s), per-robot series on (the default cap of 256), and the
  bench scrapes every replica's and the monitor's ``/metrics`` every 15 s (examples/observability's
  scrape interval), the first scrape at once.

Server CPU = user + system time of the three replica processes over the measurement window
(``/proc/<pid>/stat``), as a share of one core and relative to the baseline. Bytes per robot =
what each robot put for its telemetry (key + body + 96-byte signature attachment) per second;
Zenoh's own framing adds a few bytes per message on top. The monitor's own CPU is reported
apart (it runs on an operator's machine, not on a GPU server).

Smoke (CI): ``pytest benches/bench_monitoring.py --benchmark-disable`` (30 robots, one short round).
Measure::

    pytest benches/bench_monitoring.py --benchmark-enable --benchmark-only -s

``MONITORING_BENCH_ROBOTS`` (default 300), ``MONITORING_BENCH_WINDOW_S`` (20), ``MONITORING_BENCH_ROUNDS`` (2).
Targets: the monitored fleet's replicas use < 2 % of a core more than the baseline's; < 1 kB/s per robot.

``test_monitor_ingest_per_record`` (group ``monitor-ingest``) measures the monitor's own cost per
record, wire schema 2's work beside schema 3's (see its comment).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from benches.bench_scale import PER_PROCESS, RATE_HZ, REPLICAS, UTILISATION, Child
from servo._core import PUBLIC_KEY_SIZE, ServerIdentity, verify_signature
from servo.monitor import FleetView, RobotTrust
from servo.wire import EdgeTelemetry, Transition, decode, encode, seal_telemetry, telemetry_key
from servo.wire.telemetry import client_of_telemetry, signed_bytes
from testbed.processes import free_port

#: Four fleets of 300 robots, one after the other: minutes, not the suite's 2.
pytestmark = pytest.mark.timeout(1800)

#: The scrape interval of examples/observability/prometheus.yml (s).
SCRAPE_S = 15.0
TELEMETRY_HZ = 1.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (s)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(urls: list[str], stop: threading.Event, sizes: list[int]) -> None:
    """GET every /metrics every `SCRAPE_S`, as Prometheus would; records the bytes of each answer."""
    while True:
        for url in urls:
            with urllib.request.urlopen(url, timeout=5) as response:
                sizes.append(len(response.read()))
        if stop.wait(SCRAPE_S):
            return


def run(workdir: Path, robots: int, window_s: float, *, monitored: bool) -> dict[str, Any]:
    """One fleet, warmed up, measured over ``window_s``; returns CPU and byte figures."""
    compute_ms = 1e3 * UTILISATION / (RATE_HZ * robots / len(REPLICAS))
    router_port = free_port()
    children: list[Child] = []
    stop = threading.Event()
    sizes: list[int] = []
    try:
        router = Child(workdir, "router", "router", "--port", str(router_port))
        children.append(router)
        router.wait_for("READY", 30)
        replicas, health = {}, {}
        for name in REPLICAS:
            health[name] = free_port()
            args = ["serve", "--router", str(router_port), "--replica", name, "--compute-ms", f"{compute_ms}"]
            args += ["--health-port", str(health[name]), "--robot-metrics", "256" if monitored else "0"]
            replicas[name] = Child(workdir, name, *args)
            children.append(replicas[name])
        for child in replicas.values():
            child.wait_for("READY", 60)
        monitor_port = free_port()
        monitor = None
        if monitored:
            monitor = Child(
                workdir, "monitor", "monitor", "--router", str(router_port), "--port", str(monitor_port),
                "--out", str(workdir / "monitor.json"),  # its identity and state go beside it
            )  # fmt: skip
            children.append(monitor)
            monitor.wait_for("READY", 60)
        outputs, fleet = [], []
        for first in range(0, robots, PER_PROCESS):
            count = min(PER_PROCESS, robots - first)
            out = workdir / f"robots-{first}.json"
            outputs.append(out)
            args = ["robots", "--router", str(router_port), "--first", str(first), "--count", str(count)]
            args += ["--rate", str(RATE_HZ), "--out", str(out), "--telemetry-hz", str(TELEMETRY_HZ if monitored else 0)]
            fleet.append(child := Child(workdir, f"robots-{first}", *args))
            children.append(child)
        for child in fleet:
            child.wait_for("CONNECTED", 120)
        urls = [f"http://127.0.0.1:{port}/metrics" for port in health.values()]
        if monitored:
            urls.append(f"http://127.0.0.1:{monitor_port}/metrics")
            threading.Thread(target=scrape, args=(urls, stop, sizes), daemon=True).start()
        time.sleep(max(3.0, 2 / RATE_HZ))  # warm-up: every robot past its first request and record
        pids = [child.proc.pid for child in replicas.values()]
        cpu_before = sum(cpu_seconds(pid) for pid in pids)
        monitor_before = cpu_seconds(monitor.proc.pid) if monitor else 0.0
        start = time.monotonic()
        time.sleep(window_s)
        end = time.monotonic()
        cpu = sum(cpu_seconds(pid) for pid in pids) - cpu_before
        monitor_cpu = cpu_seconds(monitor.proc.pid) - monitor_before if monitor else 0.0
        seen = None
        if monitored:
            with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/api/fleet", timeout=10) as response:
                seen = json.load(response)
        stop.set()
        for child in fleet:
            child.stop()
        served: dict[str, list[Any]] = {}
        telemetry: dict[str, list[Any]] = {}
        for out in outputs:
            data = json.loads(out.read_text())
            served.update(data["served"])
            telemetry.update(data["telemetry"])
    finally:
        stop.set()
        for child in reversed(children):
            child.stop()
    rates = [sum(n for t, n in rows if start <= t <= end) / (end - start) for rows in telemetry.values()]
    requests = sum(1 for rows in served.values() for r in rows if start <= r[0] <= end)
    return {
        "server_cpu_s": round(cpu, 3),
        "server_cpu_core_share": round(cpu / (end - start), 4),
        "monitor_cpu_core_share": round(monitor_cpu / (end - start), 4),
        "requests_per_s": round(requests / (end - start), 1),
        "telemetry_bytes_per_robot_s": {
            "p50": round(statistics.median(rates), 1) if rates else 0.0,
            "max": round(max(rates), 1) if rates else 0.0,
        },
        "scrape_bytes": {"count": len(sizes), "max": max(sizes) if sizes else 0},
        "robots_on_monitor": None if seen is None else len(seen["robots"]),
        "robots_streaming_on_monitor": None
        if seen is None
        else sum(1 for r in seen["robots"] if r["state"] == "streaming" and not r["stale"]),
    }


def test_monitoring_cost(benchmark: BenchmarkFixture, tmp_path: Path) -> None:
    benchmark.group = "monitoring"
    smoke = benchmark.disabled
    robots = 30 if smoke else int(os.environ.get("MONITORING_BENCH_ROBOTS", "300"))
    window_s = 4.0 if smoke else float(os.environ.get("MONITORING_BENCH_WINDOW_S", "20"))
    rounds = 1 if smoke else int(os.environ.get("MONITORING_BENCH_ROUNDS", "2"))

    def measure() -> dict[str, Any]:
        results: dict[str, list[dict[str, Any]]] = {"baseline": [], "monitored": []}
        for i in range(rounds):  # interleaved, so a change of machine load hits both alike
            for kind in ("baseline", "monitored"):
                workdir = tmp_path / f"{kind}-{i}"
                workdir.mkdir()
                results[kind].append(run(workdir, robots, window_s, monitored=kind == "monitored"))
        base = statistics.median(r["server_cpu_core_share"] for r in results["baseline"])
        watched = statistics.median(r["server_cpu_core_share"] for r in results["monitored"])
        per_robot = max(r["telemetry_bytes_per_robot_s"]["max"] for r in results["monitored"])
        return {
            "robots": robots,
            "window_s": window_s,
            "rounds": rounds,
            "server_cpu_core_share": {"baseline": base, "monitored": watched},
            "added_server_cpu_core_share": round(watched - base, 4),
            "added_server_cpu_relative": round((watched - base) / base, 4) if base else None,
            "telemetry_bytes_per_robot_s_max": per_robot,
            "runs": results,
            "target_met": bool(watched - base < 0.02 and per_robot < 1000),
        }

    info = benchmark.pedantic(measure, rounds=1, iterations=1)
    benchmark.extra_info.update(info)
    print(f"\nmonitoring: {json.dumps(info)}")
    for result in info["runs"]["monitored"]:
        assert result["robots_on_monitor"] == robots  # the monitor saw every robot's signed telemetry
        assert result["telemetry_bytes_per_robot_s"]["p50"] > 0
    assert all(r["telemetry_bytes_per_robot_s"]["max"] == 0 for r in info["runs"]["baseline"])


# ----------------------------------------------------------------------------- ingest per record
# What the monitor spends on one telemetry record, on its event loop (`FleetView.on_telemetry`), in
# one run: wire schema 2's work (verify the robot's signature over the plain record, decode it,
# look its key up) as the baseline, beside schema 3's whole ingest of a record encrypted to the
# monitor (trust lookup, signature, X25519 + AES-256-GCM of its copy, decode, replay check, the
# view's bookkeeping), and the refusal of a record of a robot nobody enrolled (no signature check).
_ROBOT = ServerIdentity.from_seed(bytes(range(32)))
_MONITOR = ServerIdentity.from_seed(bytes(range(1, 33)))
_RECORDS = 20_000


def _record(seq: int, robot: str = "robot-7") -> EdgeTelemetry:
    transition = Transition("streaming", "chunk merged", 5.0)
    return EdgeTelemetry(robot, 1, seq, 1000.0, "streaming", replica="r0", rtt_ms_p50=20.0, last_transition=transition)


def _schema2(samples: list[tuple[str, bytes, bytes]]) -> Callable[[], bool]:
    keys = {"robot-7": _ROBOT.public_key}
    it = itertools.cycle(samples)

    def run() -> bool:
        key, body, attachment = next(it)
        robot = client_of_telemetry(key)
        signer, signature = attachment[:PUBLIC_KEY_SIZE], attachment[PUBLIC_KEY_SIZE:]
        ok = verify_signature(signer, signed_bytes(robot, body), signature)
        return ok and decode(body, EdgeTelemetry).client_id == robot and keys[robot] == signer

    return run


def _schema3(samples: list[tuple[str, bytes, bytes]]) -> Callable[[], bool]:
    view = FleetView(RobotTrust({"robot-7": _ROBOT.public_key}), _MONITOR)
    it = iter(samples)

    def run() -> bool:
        view.on_telemetry(*next(it))
        return not view.refused

    return run


def _stranger(samples: list[tuple[str, bytes, bytes]]) -> Callable[[], bool]:
    view = FleetView(RobotTrust({"robot-7": _ROBOT.public_key}), _MONITOR)
    sample = samples[0]
    return lambda: view.on_telemetry(*sample) is None and "unknown_robot" in view.refused


@pytest.mark.benchmark(group="monitor-ingest")
@pytest.mark.parametrize("case", ["schema 2: verify + decode", "schema 3: whole ingest", "unknown robot refused"])
def test_monitor_ingest_per_record(benchmark: BenchmarkFixture, case: str) -> None:
    n = 200 if benchmark.disabled else _RECORDS
    if case.startswith("schema 2"):
        samples = []
        for seq in range(64):
            body = encode(_record(seq))
            samples.append(
                (telemetry_key("robot-7"), body, _ROBOT.public_key + _ROBOT.sign(signed_bytes("robot-7", body)))
            )
        run = _schema2(samples)
    elif case.startswith("schema 3"):
        records = [seal_telemetry(_record(seq), _ROBOT, [_MONITOR.public_key]) for seq in range(n)]
        run = _schema3([(telemetry_key("robot-7"), *r) for r in records])
    else:
        stranger = ServerIdentity.generate()
        run = _stranger(
            [(telemetry_key("ghost"), *seal_telemetry(_record(0, "ghost"), stranger, [_MONITOR.public_key]))]
        )
    rounds = min(n, 2000) if benchmark.disabled else n // 2
    assert benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=0)
