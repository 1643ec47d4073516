"""What one forward's trip over the policy link costs: frames on the socket stream against the arena.

Smoke test: ``pytest benches/bench_policy_link.py --benchmark-disable``.
Measure: ``pytest benches/bench_policy_link.py --benchmark-enable --benchmark-only`` (writes
``benches/results/policy_link.md``).

``servo-serve`` runs its policy in a process of its own (`servo.server.policy_process`); each
forward sends the batch's observations over the link and takes the chunks back. Here one raw
two-camera observation (two 480x640 RGB frames and a 6-d state: 1.84 MB) goes to a peer process
that answers at once with a 50x6 chunk (`benches._link_peer`), through servo's `Channel`:

* ``stream`` (the baseline): the frames follow the header on the socketpair, at the socket
  buffers a stock kernel grants (``net.core.wmem_max`` 208 kB) and at the 4 MiB servo asks for;
* ``arena``: the frames are copied into the sender's memfd and out of it by the receiver
  (`servo.policy.arena`), only the header on the socket.

Per round trip: the caller's wall clock (p50, p99) and the CPU both processes used. Target
(reported): the arena at least halves the CPU of a round trip and shortens its tail.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from benches._cpu import CpuWatch
from benches._support import bench_env, markdown, percentiles_ms, results_table
from servo.policy import arena
from servo.policy.channel import Body, Channel, Infer, Outcomes
from servo.policy.protocol import DecodedObservation

STOCK_BUFFER_BYTES = 212_992
#: (name, body through the arena, socket buffer bytes)
CASES = [
    ("stream, 208 kB socket buffers", False, STOCK_BUFFER_BYTES),
    ("stream, 4 MiB socket buffers", False, 4 << 20),
    ("arena, 208 kB socket buffers", True, STOCK_BUFFER_BYTES),
]
TRIPS, WARMUP = 1000, 100


def observation() -> DecodedObservation:
    rng = np.random.default_rng(1)
    frames = {name: rng.integers(0, 255, (480, 640, 3), np.uint8) for name in ("front", "wrist")}
    return DecodedObservation(state=rng.random(6, np.float32), images=frames, task="")


def round_trips(use_arena: bool, buffer_bytes: int, trips: int) -> tuple[list[float], float]:
    """``trips`` round trips to a peer process: the wall clock of each (ms), and CPU µs per trip."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    command = [sys.executable, "-m", "benches._link_peer", str(theirs.fileno()), str(buffer_bytes)]
    peer = subprocess.Popen(command, pass_fds=(theirs.fileno(),), env=bench_env())
    theirs.close()
    channel = Channel(ours, arena="writes")
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        ours.setsockopt(socket.SOL_SOCKET, option, buffer_bytes)
    obs, took = observation(), []
    try:
        for trip in range(WARMUP + trips):
            if trip == WARMUP:
                cpu0 = time.process_time(), CpuWatch.process_jiffies(peer.pid)
            started = time.perf_counter()
            body = Body()
            channel.send(Infer([body.observation(1, obs, 0)]), body)
            reply, _ = channel.receive()
            took.append((time.perf_counter() - started) * 1e3)
            assert isinstance(reply, Outcomes)
        peer_s = (CpuWatch.process_jiffies(peer.pid) - cpu0[1]) / os.sysconf("SC_CLK_TCK")
        cpu_us = (time.process_time() - cpu0[0] + peer_s) / trips * 1e6
    finally:
        channel.close()
        peer.wait(10)
    return took[WARMUP:], cpu_us


@pytest.fixture(scope="module")
def table(request: pytest.FixtureRequest) -> Iterator[list[dict[str, Any]]]:
    yield from results_table(request, render, "policy_link.md")


def render(rows: list[dict[str, Any]]) -> str:
    return markdown(
        f"One raw observation (2 x 480x640 RGB + state, 1.84 MB) to a peer process and a 50x6 chunk back "
        f"through `servo.policy.channel`, {rows[0]['trips']} round trips after {WARMUP}; CPU = both processes' "
        f"user + system time per round trip (`pytest benches/bench_policy_link.py --benchmark-enable "
        f"--benchmark-only`, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end).",
        ["frames cross", "round trip p50 / p99 ms", "CPU µs per round trip"],
        [(r["case"], f"{r['p50']:.3f} / {r['p99']:.3f}", f"{r['cpu_us']:.0f}") for r in rows],
    )


@pytest.mark.benchmark(group="policy-link")
@pytest.mark.parametrize(("case", "use_arena", "buffer_bytes"), CASES, ids=[c[0] for c in CASES])
def test_policy_link_round_trip(
    benchmark: Any,
    table: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    use_arena: bool,
    buffer_bytes: int,
) -> None:
    monkeypatch.setattr(arena, "AVAILABLE", use_arena and arena.AVAILABLE)
    trips = 20 if benchmark.disabled else TRIPS
    took, cpu_us = benchmark.pedantic(round_trips, args=(use_arena, buffer_bytes, trips), rounds=1, iterations=1)
    p50, p99 = percentiles_ms(took, [0.5, 0.99])
    table.append({"case": case, "trips": trips, "p50": p50, "p99": p99, "cpu_us": cpu_us, "smoke": benchmark.disabled})
    assert len(took) == trips
