"""Rebalance without a herd (issue 30 item 5): how many robots move when a replica appears, against
how many must, and whether any moves back — the settling of before issue 30 beside today's, one run.

Processes (`benches._scale`, `benches._settle`): a Zenoh router, replica r0 holding every robot,
robot processes of 50 robots each sharing one Zenoh session. Each round starts replica r1; each
robot settles the way a streaming edge does when a replica's token appears (switching at each
move, then settling again from there); the round ends once the replicas hold their shares and no
robot moved for `QUIET_S`, or after `ROUND_S`. Then r1 drains (its robots place themselves back on
r0, which does not count) for the next round. Rules, same run:

* ``old`` — settling before issue 30 (`benches._settle.old_rebalance`): a look every 0-30 ms, each
  robot two or more above the emptiest moves at once with the chance (here - mean) / here.
* ``new`` — `servo.client.settle`: the same chance, then a second look spread over the crowd before
  moving, thinned by the excess left, and 1 s held still after a move.

Needed moves per round: robots - ceil(robots / 2). A move back is a robot moving to the replica it
left less than 1 s before. Zenoh over TCP on 127.0.0.1 through the router.

Smoke (CI): ``pytest benches/bench_rebalance.py --benchmark-disable`` (2 robots, 1 round per rule).
Measure::

    pytest benches/bench_rebalance.py --benchmark-enable --benchmark-only -s

``REBALANCE_ROUNDS_2`` (default 10) rounds with 2 robots, ``REBALANCE_ROUNDS_300`` (default 2) with
300. Target (``new``): moves per round = needed in every round, 0 moves back within 1 s.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from benches._support import markdown, results_table
from benches.bench_scale import Child
from servo.client import PolicyClient
from servo.transport import ZenohSettings, open_zsession
from testbed.processes import free_port

PER_PROCESS = 50
#: A round is over once the replicas hold their shares and nobody moved for this long (s): longer
#: than the widest look window of `servo.client.settle`, so a robot still looking had its say.
QUIET_S = 16.0
#: ... or after this long (s).
ROUND_S = 90.0
#: A move to the replica left less than this before is a move back (s).
BACK_S = 1.0


async def census(router_port: int) -> dict[str, int]:
    async with open_zsession(ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{router_port}"])) as z:
        servers = await PolicyClient(z, "census").discover(app="scale", timeout=2.0)
    return {s.keys.replica: s.status.active_sessions for s in servers}


def moves_of(outputs: list[Path]) -> list[list[Any]]:
    moves: list[list[Any]] = []
    for out in outputs:
        moves += json.loads(out.read_text())["moves"]
    return sorted(moves)


def run_rule(workdir: Path, rule: str, robots: int, rounds: int) -> list[dict[str, Any]]:
    """``rounds`` appearances of r1 beside ``robots`` robots settling by ``rule``; one row per round."""
    router_port = free_port()
    children: list[Child] = []
    rows = []
    try:
        router = Child(workdir, f"router-{rule}", "router", "--port", str(router_port))
        children.append(router)
        router.wait_for("READY", 30)
        serve = ("serve", "--router", str(router_port), "--compute-ms", "5")
        r0 = Child(workdir, f"r0-{rule}", *serve, "--replica", "r0")
        children.append(r0)
        r0.wait_for("READY", 60)
        outputs, fleet = [], []
        for first in range(0, robots, PER_PROCESS):
            count = min(PER_PROCESS, robots - first)
            out = workdir / f"moves-{rule}-{robots}-{first}.json"
            outputs.append(out)
            args = ("--router", str(router_port), "--first", str(first), "--count", str(count), "--rule", rule)
            child = Child(workdir, f"robots-{rule}-{first}", *args, "--out", str(out), module="benches._settle")
            fleet.append(child)
            children.append(child)
        for child in fleet:
            child.wait_for("CONNECTED", 180)
        starts = []
        for _ in range(rounds):
            r1 = Child(workdir, f"r1-{rule}", *serve, "--replica", "r1")
            children.append(r1)
            r1.wait_for("READY", 60)
            starts.append(time.monotonic())
            share = math.ceil(robots / 2)
            deadline = time.monotonic() + ROUND_S
            while time.monotonic() < deadline:
                held = anyio.run(census, router_port)
                if max(held.values(), default=0) <= share and sum(held.values()) == robots:
                    break
                time.sleep(0.5)
            time.sleep(QUIET_S)  # the slowest looks had their say: a late move would still count
            rows.append({"held": anyio.run(census, router_port), "drained_at": time.monotonic()})
            print(f"{rule} {robots}: round {len(rows)} held {rows[-1]['held']}", flush=True)
            r1.stop()  # drains: its robots place themselves on r0 again (not counted: the round is over)
            children.remove(r1)
            deadline = time.monotonic() + ROUND_S
            while anyio.run(census, router_port).get("r0", 0) < robots and time.monotonic() < deadline:
                time.sleep(0.5)
            rows[-1]["back_on_r0"] = anyio.run(census, router_port).get("r0", 0)
        for child in fleet:
            child.stop()
        moves = moves_of(outputs)
    finally:
        for child in reversed(children):
            child.stop()
    for row, start in zip(rows, starts, strict=True):
        row.update(analyse([m for m in moves if start <= m[0] < row["drained_at"]], robots, start))
    return rows


def analyse(moves: list[list[Any]], robots: int, start: float) -> dict[str, Any]:
    """One round's moves: how many, against how many were needed, and the moves back."""
    last: dict[int, tuple[float, str]] = {}
    back = twice = 0
    for at, robot, was, now in moves:
        if robot in last:
            twice += 1
            if last[robot][1] == now and at - last[robot][0] < BACK_S:
                back += 1
        last[robot] = (at, was)
    return {
        "moves": len(moves),
        "needed": robots - math.ceil(robots / 2),
        "moved_again": twice,
        "moved_back_within_1s": back,
        "last_move_s": round(moves[-1][0] - start, 2) if moves else None,
    }


def render(rows: list[dict[str, Any]]) -> str:
    body = []
    for row in rows:
        rounds = row["rounds"]
        over = sum(r["moves"] > r["needed"] for r in rounds)
        body.append(
            (
                row["robots"],
                row["rule"],
                len(rounds),
                rounds[0]["needed"],
                " ".join(str(r["moves"]) for r in rounds),
                f"{over} of {len(rounds)}",
                sum(r["moved_back_within_1s"] for r in rounds),
                sum(r["moved_again"] for r in rounds),
                max((r["last_move_s"] or 0.0) for r in rounds),
            )
        )
    title = (
        "# Rebalance when a replica appears (issue 30 item 5) — `benches/bench_rebalance.py`\n\n"
        "Robots on r0, then r1 starts; each robot settles as a streaming edge does. Old rule = before "
        "issue 30, new = `servo.client.settle`; same run."
    )
    header = (
        "robots",
        "rule",
        "rounds",
        "needed per round",
        "moves per round",
        "rounds with more than needed",
        "moves back within 1 s",
        "robots moving twice",
        "last move after r1 (s, max)",
    )
    return markdown(title, header, body)


@pytest.fixture(scope="module")
def table(request: pytest.FixtureRequest) -> Iterator[list[dict[str, Any]]]:
    yield from results_table(request, render, "rebalance.md")


@pytest.mark.timeout(3600)  # every round starts a replica and waits out the slowest looks
@pytest.mark.parametrize("robots", [2, 300])
def test_rebalance(benchmark: BenchmarkFixture, tmp_path: Path, table: list[dict[str, Any]], robots: int) -> None:
    benchmark.group = "rebalance"
    if benchmark.disabled and robots > 2:
        pytest.skip("the 300-robot fleet is a measurement, not a smoke test")
    default = "10" if robots == 2 else "2"
    rounds = 1 if benchmark.disabled else int(os.environ.get(f"REBALANCE_ROUNDS_{robots}", default))

    def run() -> dict[str, Any]:
        return {rule: run_rule(tmp_path, rule, robots, rounds) for rule in ("old", "new")}

    info = benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(info)
    for rule, rounds_of in info.items():
        table.append({"robots": robots, "rule": rule, "rounds": rounds_of, "smoke": benchmark.disabled})
    new = info["new"]
    assert all(sum(r["held"].values()) == robots for r in new)
    assert sum(r["moved_back_within_1s"] for r in new) == 0
