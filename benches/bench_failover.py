"""Fresh actions after failover and restart (issues 9 and 19), over direct links and through a router.

Two ``servo-serve`` replicas of the reference policy (100 ms forwards, one 48x64 camera) and one
edge (`RemoteEngine` + `EdgeRuntime`, the sim arm, default options except a 30 s reconnect
backoff, so a recovery that waited for a timer would show). Zenoh over TCP on 127.0.0.1, shared
memory on (the default). Topologies, same run:

* ``router`` — both replicas and the edge are clients of a Zenoh router opened in this process.
* ``direct`` — no router: each replica listens on its own port and the edge (``zenoh_mode =
  "peer"``) dials both; a replica that comes back is re-dialled every `REDIAL_MS` at most.

Rounds, all timed on the edge's monotonic clock:

* **kill** — at a random moment of the chunk cycle (uniform over 0-1.5 s of streaming), SIGKILL
  the replica the edge is on: kill → its session on the other replica (polled every 2 ms) → the
  first chunk of that session merged (RTC replaces the queue: the next control tick executes
  it, so this is the first fresh action). Then the killed replica is started again.
  Also timed: kill → the edge's session *noticed* lost (its ``lost`` event, polled every 2 ms):
  the kernel closes the dead replica's sockets, Zenoh drops its token, the session hears it;
  and kill → the replica *exited* (reaped): a dying process unmaps its memory, then closes its
  sockets, then becomes a zombie, so this bounds from above when its sockets closed (at load,
  seconds for a process of a few hundred MB).
* **freeze** — SIGSTOP the replica the edge is on (a hung or unplugged server: no socket closes)
  → its session noticed lost, which only the replica's Zenoh lease (`lease_ms`) can tell. Then the
  frozen replica is killed and started again.
* **restart** — SIGKILL both, start one: it is *ready* when its ``/healthz`` answers 200 (polled
  every 5 ms; the liveliness token is declared just before) → the edge's session on it → the
  first chunk merged from it.

Smoke (CI): ``pytest benches/bench_failover.py --benchmark-disable`` (2 kills, 1 restart per topology).
Measure::

    pytest benches/bench_failover.py --benchmark-enable --benchmark-only -s

``FAILOVER_BENCH_KILLS`` (default 20) / ``FAILOVER_BENCH_FREEZES`` (default 3) /
``FAILOVER_BENCH_RESTARTS`` (default 5) rounds per topology; ``FAILOVER_BENCH_HOGS=N`` runs
the rounds beside N busy loops (`testbed.load`), to measure at load (paused while a killed
replica starts again, until it is ready: at load 16 that alone takes minutes).
Targets: first fresh action <= 0.5 s + one inference after the kill; a kill noticed <= 0.3 s on
a quiet machine, a freeze within the lease; the restarted replica holds the edge's session
<= 0.2 s after it is ready.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from benches._support import markdown, percentiles_ms, results_table
from servo.client import RemoteSession
from servo.edge.config import load_edge_config
from servo.edge.pipeline import MergeEvent
from servo.edge.remote import RemoteEngine
from servo.edge.runtime import EdgeRuntime, RunOptions
from servo.logs import configure_logging
from servo.robots import RobotDescription
from servo.transport import DEFAULT_LEASE_MS, ZenohSettings, open_zsession
from testbed.load import CpuHogs
from testbed.processes import free_port

#: One inference: long enough that a kill at a random moment often lands mid-forward.
COMPUTE_MS = 100.0
BACKOFF_S = 30.0
FRESH_TARGET_S = 0.5 + COMPUTE_MS / 1e3
SESSION_TARGET_S = 0.2
NOTICE_TARGET_S = 0.3
#: The replicas' Zenoh lease (their manifests' default): a frozen replica is noticed after it.
LEASE_S = DEFAULT_LEASE_MS / 1000
TOPOLOGIES = ("direct", "router")


class Replica:
    """One ``servo-serve`` child; `start` returns the monotonic ns its ``/healthz`` first said 200."""

    def __init__(self, workdir: Path, name: str, router_port: int | None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.port = free_port()
        self.health_port = free_port()
        self.manifest = workdir / "manifest.toml"
        connect = f'connect = ["tcp/127.0.0.1:{router_port}"]' if router_port else ""
        self.manifest.write_text(
            f"""
[model]
source = "reference"
revision = "bench"
warmup = 1
[model.options]
cameras = {{front = [48, 64]}}
compute_ms = {COMPUTE_MS}
[serving]
app = "failover"
replica = "{name}"
[zenoh]
mode = "peer"
listen = ["tcp/127.0.0.1:{self.port}"]
{connect}
[ops]
health_port = {self.health_port}
[security]
listen_beside_router = true
"""
        )
        self.log = workdir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        #: When the last killed process exited (monotonic ns; None until it has).
        self.exited_ns: int | None = None

    def start(self, timeout: float = 60.0) -> int:
        if self.proc is not None:
            self.proc.wait(60)  # the killed one reaped: its ports are free again
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "servo.cli.serve", str(self.manifest), "--log-level", "warning"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        url = f"http://127.0.0.1:{self.health_port}/healthz"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(url, timeout=0.5) as reply:
                    if reply.status == 200:
                        return time.monotonic_ns()
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.005)  # the poll's resolution
        raise RuntimeError(f"replica {self.name} did not start:\n{self.log.read_text()}")

    def kill(self) -> int:
        """SIGKILL; returns the monotonic time (ns) of the kill.

        Reaped by a thread of its own, not here: a dying process at load takes seconds to exit,
        and the edge's reaction is timed meanwhile (polled from the moment this returns). The
        moment it exited (`exited_ns`) bounds from above when the kernel closed its sockets: a
        dying process closes its files after it unmapped its memory, and becomes a zombie after both.
        """
        proc = self.proc
        assert proc is not None
        self.exited_ns = None
        killed = time.monotonic_ns()
        proc.kill()

        def reap() -> None:
            proc.wait()
            self.exited_ns = time.monotonic_ns()

        threading.Thread(target=reap, name="bench-reaper", daemon=True).start()
        return killed

    def freeze(self) -> int:
        """SIGSTOP (SIGKILL ends it later); returns the monotonic time (ns) of the stop."""
        assert self.proc is not None
        frozen = time.monotonic_ns()
        self.proc.send_signal(signal.SIGSTOP)
        return frozen

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` (counters written by other tasks) under a deadline."""
    try:
        with anyio.fail_after(timeout):
            while not predicate():  # noqa: ASYNC110 - the conditions expose no event
                await anyio.sleep(0.002)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}") from None


def replica_of(engine: RemoteEngine) -> str | None:
    """The replica the engine's session is on."""
    return None if engine.server is None else engine.server.keys.replica


@asynccontextmanager
async def fleet(workdir: Path, topology: str) -> AsyncIterator[tuple[list[str], dict[str, Replica]]]:
    """The replicas, started; yields the endpoints the edge dials and the replicas."""
    port = free_port()
    if topology == "router":
        router = ZenohSettings(mode="router", listen=[f"tcp/127.0.0.1:{port}"])
        async with open_zsession(router), _replicas(workdir, port) as replicas:
            yield [f"tcp/127.0.0.1:{port}"], replicas
    else:
        async with _replicas(workdir, None) as replicas:
            yield [f"tcp/127.0.0.1:{r.port}" for r in replicas.values()], replicas


@asynccontextmanager
async def _replicas(workdir: Path, router_port: int | None) -> AsyncIterator[dict[str, Replica]]:
    replicas = {name: Replica(workdir / name, name, router_port) for name in ("a", "b")}
    try:
        for replica in replicas.values():
            await anyio.to_thread.run_sync(replica.start)
        yield replicas
    finally:
        for replica in replicas.values():
            await anyio.to_thread.run_sync(replica.stop)


Times = dict[str, list[float]]


async def measure(workdir: Path, topology: str, rounds: dict[str, int], seed: int, hogs: CpuHogs) -> Times:
    """Seconds from each kill, freeze (or ready) to the loss noticed, the new session and its first chunk.

    ``hogs`` run from the first chunk on, paused while a killed replica starts again (bookkeeping,
    minutes at load) until it is ready: every kill, freeze and recovery happens beside them.
    """
    rng = random.Random(seed)
    robot = RobotDescription("sim", {"cameras": "front:64x48"})
    times: Times = {name: [] for name in NAMES}
    async with fleet(workdir / topology, topology) as (connect, replicas):
        config = load_edge_config(
            flags={
                "connect": connect,
                "zenoh_mode": "peer" if topology == "direct" else "client",
                "app": "failover",
                "max_offline_s": 600.0,
                "reconnect_initial_backoff_s": BACKOFF_S,
                "reconnect_max_backoff_s": BACKOFF_S,
            }
        )
        engine = RemoteEngine(config, robot.spec())
        merges: list[tuple[int, str, float]] = []  # (merge time, session id, its forward in s)

        def on_merge(event: MergeEvent) -> None:
            if event.trimmed is not None:
                merges.append((event.now_ns, event.produced.session_id, event.produced.inference_ms / 1e3))

        engine.on_merge = on_merge
        runtime = EdgeRuntime(robot, engine, config, RunOptions(park_timeout_s=0.5))

        async def recovery(since: int, replica: str) -> tuple[float, float, float]:
            await until(
                lambda: engine.session is not None and replica_of(engine) == replica, 20, f"a session on {replica}"
            )
            session_s = (time.monotonic_ns() - since) / 1e9
            session = engine.session
            assert session is not None
            await until(lambda: any(sid == session.session_id for _, sid, _ in merges), 20, "a fresh chunk")
            fresh, forward_s = next((t, f) for t, sid, f in merges if sid == session.session_id)
            return session_s, (fresh - since) / 1e9, forward_s

        async def noticed(session: RemoteSession, since: int) -> float:
            await until(session.lost.is_set, 20, "the loss noticed")
            return (time.monotonic_ns() - since) / 1e9

        async def exit_of(replica: Replica) -> int:
            await until(lambda: replica.exited_ns is not None, 60, "the killed replica's exit")
            assert replica.exited_ns is not None
            return replica.exited_ns

        async def start(replica: Replica) -> int:
            with hogs.paused():
                return await anyio.to_thread.run_sync(replica.start)

        async with anyio.create_task_group() as tg:
            tg.start_soon(runtime.run)
            await until(lambda: len(merges) >= 3, 60, "streaming")
            hogs.start()
            for _ in range(rounds["kills"]):
                await anyio.sleep(rng.uniform(0.0, 1.5))  # anywhere in the chunk cycle
                serving, session = replica_of(engine), engine.session
                assert serving is not None
                assert session is not None
                other = next(name for name in replicas if name != serving)
                killed = await anyio.to_thread.run_sync(replicas[serving].kill)
                times["kill_notice"].append(await noticed(session, killed))
                session_s, fresh_s, forward_s = await recovery(killed, other)
                times["kill_session"].append(session_s)
                times["kill_fresh"].append(fresh_s)
                times["kill_forward"].append(forward_s)
                times["kill_servo"].append(fresh_s - forward_s)
                exited = await exit_of(replicas[serving])
                times["kill_exit"].append((exited - killed) / 1e9)
                await start(replicas[serving])
            for _ in range(rounds["freezes"]):
                await anyio.sleep(rng.uniform(0.0, 1.5))
                serving, session = replica_of(engine), engine.session
                assert serving is not None
                assert session is not None
                frozen = replicas[serving].freeze()
                times["freeze_notice"].append(await noticed(session, frozen))
                await anyio.to_thread.run_sync(replicas[serving].kill)
                await start(replicas[serving])
            for _ in range(rounds["restarts"]):
                for replica in replicas.values():
                    await anyio.to_thread.run_sync(replica.kill)
                await until(lambda: engine.session is None, 10, "nobody left")
                ready = await start(replicas["a"])
                session_s, fresh_s, _ = await recovery(ready, "a")
                times["ready_session"].append(session_s)
                times["ready_fresh"].append(fresh_s)
                await start(replicas["b"])
            runtime.request_stop("bench done")
    return times


NAMES = (
    "kill_exit",
    "kill_notice",
    "kill_session",
    "kill_fresh",
    "kill_forward",
    "kill_servo",
    "freeze_notice",
    "ready_session",
    "ready_fresh",
)


def render(rows: list[dict[str, Any]]) -> str:
    hogs = rows[0]["hogs"]
    title = (
        f"Failover and restart: 2 replicas, {COMPUTE_MS:g} ms forwards, one edge with default options "
        "(30 s backoff), Zenoh TCP on 127.0.0.1 with shared memory; seconds on the edge's clock, "
        f"p50 / p99 / max (machine load {os.getloadavg()[0]:.1f}"
        + (f", {hogs} busy loops of the bench's own" if hogs else "")
        + ")."
    )
    header = ["topology", "kills", "kill → exited", "kill → noticed", "kill → session", "kill → first fresh chunk"]
    header += ["its forward (server)", "kill → first fresh chunk less its forward"]
    header.append("freezes")
    header += ["freeze → noticed", "restarts", "ready → session", "ready → first fresh chunk"]
    cells = []
    for r in rows:
        timed = {
            n: "n/a" if not r[n]["n"] else f"{r[n]['p50']:.3f} / {r[n]['p99']:.3f} / {r[n]['max']:.3f}" for n in NAMES
        }
        kills = [
            r["kill_fresh"]["n"],
            timed["kill_exit"],
            timed["kill_notice"],
            timed["kill_session"],
            timed["kill_fresh"],
            timed["kill_forward"],
            timed["kill_servo"],
        ]
        freezes = [r["freeze_notice"]["n"], timed["freeze_notice"]]
        cells.append(
            [r["topology"], *kills, *freezes, r["ready_fresh"]["n"], timed["ready_session"], timed["ready_fresh"]]
        )
    targets = (
        f"Targets: kill → first fresh chunk <= {FRESH_TARGET_S:.1f} s (0.5 s + one inference: less the "
        "inference the server reported for that chunk, <= 0.5 s); kill → noticed "
        f"<= {NOTICE_TARGET_S:.1f} s on a quiet machine; freeze → noticed within the lease ({LEASE_S:g} s) and "
        f"its detection; ready → session <= {SESSION_TARGET_S:.1f} s."
    )
    return markdown(title, header, cells) + "\n\n" + targets


@pytest.fixture(scope="module")
def table(request: pytest.FixtureRequest) -> Iterator[list[dict[str, Any]]]:
    yield from results_table(request, render, "failover.md")


@pytest.mark.timeout(1800)  # every kill round restarts a replica: seconds each on a loaded machine
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_failover(benchmark: BenchmarkFixture, tmp_path: Path, table: list[dict[str, Any]], topology: str) -> None:
    configure_logging("warning")
    benchmark.group = "failover"
    smoke = benchmark.disabled
    rounds = {
        "kills": 2 if smoke else int(os.environ.get("FAILOVER_BENCH_KILLS", "20")),
        "freezes": 1 if smoke else int(os.environ.get("FAILOVER_BENCH_FREEZES", "3")),
        "restarts": 1 if smoke else int(os.environ.get("FAILOVER_BENCH_RESTARTS", "5")),
    }
    hogs = 0 if smoke else int(os.environ.get("FAILOVER_BENCH_HOGS", "0"))
    seed = random.randrange(1 << 30)

    def run() -> Times:
        load = CpuHogs(hogs)  # `measure` starts them once the edge streams
        try:
            return anyio.run(measure, tmp_path, topology, rounds, seed, load, backend="asyncio")
        finally:
            load.stop()

    times = benchmark.pedantic(run, rounds=1, iterations=1)
    info: dict[str, Any] = {"topology": topology, "seed": seed, "hogs": hogs}
    for name, values in times.items():
        p50, p99 = percentiles_ms([v * 1e3 for v in values], [0.5, 0.99])
        info[name] = {"n": len(values), "p50": p50 / 1e3, "p99": p99 / 1e3, "max": max(values, default=float("nan"))}
    # "0.5 s + one inference": the inference that chunk took, which a loaded CPU stretches past COMPUTE_MS.
    info["target_met"] = bool(
        info["kill_servo"]["max"] <= FRESH_TARGET_S - COMPUTE_MS / 1e3
        and info["ready_session"]["max"] <= SESSION_TARGET_S
    )
    benchmark.extra_info.update(info)
    table.append({**info, "smoke": benchmark.disabled})
    assert len(times["kill_fresh"]) == rounds["kills"]
    assert len(times["freeze_notice"]) == rounds["freezes"]
    assert len(times["ready_fresh"]) == rounds["restarts"]
    # Far below the 30 s backoff: events drove every recovery.
    assert max(times["kill_fresh"] + times["ready_fresh"]) < BACKOFF_S / 2
