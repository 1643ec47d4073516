"""Rig of bench_edge.py: a policy server in another process, servo's edge runtime driving a
simulated SO-100 with two 480x640 cameras, CPU hogs, and the results' bookkeeping.

* `ServerProcess` runs ``servo-serve`` (reference policy padded to ``compute_ms``) with an audit
  log, the server's own per-request durations (queue wait, inference) joined on (session, seq).
* `run_servo` runs `EdgeRuntime` + `RemoteEngine` for a fixed time, the control loop in its own
  process or (the baseline) on a thread; `EngineBase.on_merge` reports every merge with its
  duration (the ActionQueue.merge call) and the chunk's observation stamp. Tick lateness comes
  from the control loop's own histogram (`servo.edge.channel`), the same for both.
* `testbed.load` keeps every core busy (`CpuHogs`), `benches._cpu` says who used the cores (`CpuWatch`).
* The legacy inline loop (docs/design/control-loop.md §1) is in `benches._naive_loop`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Self

import anyio
import numpy as np
import numpy.typing as npt

from benches._cpu import CpuWatch
from servo.edge.channel import LATENESS_BINS, lateness_bin, lateness_percentiles_ms
from servo.edge.config import load_edge_config
from servo.edge.pipeline import MergeEvent
from servo.edge.remote import RemoteEngine
from servo.edge.runtime import EdgeRuntime, RunOptions, RunSummary
from servo.robots import RobotDescription
from testbed.load import CpuHogs
from testbed.processes import stop

JPEG_QUALITY = 90
COMPUTE_MS = 20.0
CHUNK = 50


# ----------------------------------------------------------------------------- server


class ServerProcess:
    """``servo-serve`` in a child process (reference policy, two 480x640 cameras, audit log).

    ``options`` adds lines to ``[model.options]`` (e.g. other cameras), ``zenoh`` to ``[zenoh]``,
    ``extra`` more tables. It listens on ``protocol/host``; ``launch`` wraps its command line (e.g.
    `testbed.netns.Link.remote`, to run it behind a link); ``env`` adds to its environment.
    """

    def __init__(
        self,
        workdir: Path,
        port: int,
        *,
        compute_ms: float = COMPUTE_MS,
        options: str = "",
        zenoh: str = "",
        extra: str = "",
        host: str = "127.0.0.1",
        protocol: str = "tcp",
        launch: Callable[..., list[str]] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.port = port
        self.audit = workdir / "audit.jsonl"
        self.manifest = workdir / "manifest.toml"
        self.manifest.write_text(
            f"""
[model]
source = "reference"
revision = "bench"
warmup = 3
[model.options]
chunk_size = {CHUNK}
fps = 30.0
compute_ms = {compute_ms}
{options}
[serving]
max_sessions = 4
[zenoh]
mode = "peer"
listen = ["{protocol}/{host}:{port}"]
{zenoh}
[ops]
health_port = 0
audit_log = "{self.audit}"
{extra}
"""
        )
        self.log = workdir / "server.log"
        self._out = self.log.open("w")
        # info: at warning level the server's audit log stays empty (its lines are info).
        command = [sys.executable, "-m", "servo.cli.serve", str(self.manifest), "--log-level", "info"]
        self.proc = subprocess.Popen(
            command if launch is None else launch(*command),
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )

    def __enter__(self) -> Self:
        """Wait until it serves (stopped when the block exits)."""
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        stop = threading.Event()
        while "ready" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"servo-serve did not start:\n{self.log.read_text()}")
            stop.wait(0.05)

    def audit_records(self, session_id: str) -> dict[int, dict[str, Any]]:
        """seq_id -> audit line of one session."""
        out: dict[int, dict[str, Any]] = {}
        for line in self.audit.read_text().splitlines():
            record = json.loads(line)
            if record.get("session_id") == session_id and record.get("outcome") == "ok":
                out[int(record["seq_id"])] = record
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            stop(self.proc, grace_s=20)
        self._out.close()


# ----------------------------------------------------------------------------- results


@dataclass
class Breakdown:
    """One request's round trip (ms): encode + transport + queue wait + inference = rtt."""

    encode: float
    transport: float
    queue_wait: float
    inference: float
    rtt: float
    merge: float


def lateness_histogram(lateness_ns: list[int]) -> npt.NDArray[np.uint64]:
    """The control loop's histogram of a list of lateness values (for the inline loop)."""
    counts = np.zeros(LATENESS_BINS, np.uint64)
    for ns in lateness_ns:
        counts[lateness_bin(abs(ns))] += 1
    return counts


@dataclass
class LoopResult:
    """What one run measured. Lateness is the control loop's histogram (10 µs bins below 10 ms)."""

    design: str
    fps: float
    duration_s: float
    ticks: int
    missed_deadlines: int
    lateness_counts: npt.NDArray[np.uint64]
    lateness_max_ms: float
    requests: list[Breakdown] = field(default_factory=list)
    chunks: int = 0
    realtime: bool = False
    where: str = ""
    final_state: str = ""
    error: str = ""
    hogs: int = 0
    round_p99_ms: list[float | None] = field(default_factory=list)
    #: Cores busy with other processes during each round (the noise next to the numbers).
    background_cores: list[float | None] = field(default_factory=list)
    #: Cores the control process used (its tick, sleeps and spinning), each round; None on a thread.
    control_cpu: float | None = None
    spin: bool = True
    round_control_cpu: list[float | None] = field(default_factory=list)

    @property
    def p99_ms(self) -> float | None:
        points = lateness_percentiles_ms(self.lateness_counts, [0.99], round(self.lateness_max_ms * 1e6))
        return None if points is None else points[0]

    @classmethod
    def pooled(cls, rounds: list[LoopResult]) -> LoopResult:
        """Several rounds of the same design as one result (histograms summed, each round's p99 kept)."""
        first = rounds[0]
        return cls(
            design=first.design,
            fps=first.fps,
            duration_s=sum(r.duration_s for r in rounds),
            ticks=sum(r.ticks for r in rounds),
            missed_deadlines=sum(r.missed_deadlines for r in rounds),
            lateness_counts=np.sum([r.lateness_counts for r in rounds], axis=0, dtype=np.uint64),
            lateness_max_ms=max(r.lateness_max_ms for r in rounds),
            requests=[x for r in rounds for x in r.requests],
            chunks=sum(r.chunks for r in rounds),
            realtime=all(r.realtime for r in rounds),
            where=first.where,
            final_state=",".join(sorted({r.final_state for r in rounds})),
            error="; ".join(r.error for r in rounds if r.error),
            hogs=first.hogs,
            round_p99_ms=[r.p99_ms for r in rounds],
            background_cores=[c for r in rounds for c in r.background_cores],
            spin=first.spin,
            round_control_cpu=[r.control_cpu for r in rounds],
        )

    def summary(self) -> dict[str, Any]:
        max_ns = round(self.lateness_max_ms * 1e6)
        points = lateness_percentiles_ms(self.lateness_counts, [0.5, 0.99], max_ns) or [None, None]
        out: dict[str, Any] = {
            "design": self.design,
            "fps": self.fps,
            "duration_s": round(self.duration_s, 2),
            "ticks": self.ticks,
            "expected_ticks": round(self.duration_s * self.fps),
            "missed_deadlines": self.missed_deadlines,
            "lateness_ms": {"p50": points[0], "p99": points[1], "max": round(self.lateness_max_ms, 3)},
            "chunks": self.chunks,
            "realtime": self.realtime,
            "where": self.where,
            "hogs": self.hogs,
            "final_state": self.final_state,
            "error": self.error,
            "round_lateness_p99_ms": self.round_p99_ms,
            "background_cores": self.background_cores,
            "spin": self.spin,
            "control_process_cores": self.round_control_cpu,
        }
        for name in ("encode", "transport", "queue_wait", "inference", "rtt", "merge"):
            values = np.asarray([getattr(r, name) for r in self.requests], dtype=np.float64)
            out[f"{name}_ms"] = _pcts(values)
        return out


def _pcts(values: np.ndarray) -> dict[str, float | None]:
    if values.size == 0:
        return {"p50": None, "p99": None}
    return {"p50": round(float(np.percentile(values, 50)), 3), "p99": round(float(np.percentile(values, 99)), 3)}


# ----------------------------------------------------------------------------- servo


async def run_servo(
    server: ServerProcess,
    fps: float,
    duration_s: float,
    *,
    control_loop: Literal["auto", "thread"],
    realtime: bool,
    switch_interval_s: float | None,
    design: str,
    robot: RobotDescription | None = None,
    spin: bool = True,
) -> LoopResult:
    """servo's edge: the control loop in its process (or on a thread), the network worker on the event loop.

    ``robot`` defaults to the simulated arm at ``fps`` with its two 480x640 cameras at 30 fps.
    """
    robot = robot or RobotDescription("sim", {"fps": fps})
    config = load_edge_config(flags={"connect": [f"tcp/127.0.0.1:{server.port}"], "jpeg_quality": JPEG_QUALITY})
    engine = RemoteEngine(config, robot.spec())
    # One request is in flight at a time: at merge time the session's last encode is this chunk's.
    merges: list[tuple[MergeEvent, float]] = []

    def on_merge(event: MergeEvent) -> None:
        session = engine.session
        merges.append((event, session.stats.last_encode_ms if session is not None else float("nan")))

    engine.on_merge = on_merge
    options = RunOptions(
        duration_s=duration_s,
        realtime=realtime,
        switch_interval_s=switch_interval_s,
        park_timeout_s=0.5,
        control_loop=control_loop,
        spin=spin,
    )
    runtime = EdgeRuntime(robot, engine, config, options)
    control_cpu: list[float | None] = [None]

    async def run() -> RunSummary:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_control_cpu, runtime, duration_s * 0.8, control_cpu)
            summary = await runtime.run()
            tg.cancel_scope.cancel()
        return summary

    summary = await run()
    loop = runtime.loop
    assert loop is not None
    session = engine.session
    session_hex = "" if session is None else session.session_id
    audit = server.audit_records(session_hex) if session is not None else {}
    requests = []
    for event, encode_one in merges:
        seq = event.produced.seq_id
        obs_ns, arrived_ns, merge_ms = event.request.obs.mono_ns, event.now_ns, event.merge_ns / 1e6
        record = audit.get(seq)
        if record is None or event.produced.session_id != session_hex:
            continue
        rtt = (arrived_ns - obs_ns) / 1e6
        queue_wait, inference = float(record["queue_wait_ms"]), float(record["inference_ms"])
        transport = rtt - queue_wait - inference - encode_one
        requests.append(Breakdown(encode_one, transport, queue_wait, inference, rtt, merge_ms))
    stats = loop.statistics()
    return LoopResult(
        design=design,
        fps=fps,
        duration_s=duration_s,
        ticks=stats.ticks,  # the park at the end included: those ticks must be on time too
        missed_deadlines=stats.missed_deadlines,
        lateness_counts=loop.channel.lateness_counts(),
        lateness_max_ms=stats.lateness_ms["max"] or 0.0,
        requests=requests,
        chunks=summary.chunks_received,
        realtime=stats.realtime,
        where=summary.control_loop,
        final_state=summary.final_state,
        error=loop.error or summary.fault,
        control_cpu=control_cpu[0],
        spin=spin,
    )


async def _control_cpu(runtime: EdgeRuntime, seconds: float, out: list[float | None]) -> None:
    """Cores the control process used over ``seconds`` once it runs (``out[0]``; stays None for a thread)."""
    while runtime.loop is None or not runtime.loop.running:  # noqa: ASYNC110 - no event for it
        await anyio.sleep(0.01)
    pid = getattr(runtime.loop, "pid", None)
    if pid is None:
        return
    try:
        before, started = CpuWatch.process_jiffies(pid), time.monotonic()
        await anyio.sleep(seconds)
        used = CpuWatch.process_jiffies(pid) - before
    except (OSError, ValueError, IndexError):
        return
    out[0] = round(used / os.sysconf("SC_CLK_TCK") / (time.monotonic() - started), 3)


def pooled_rounds(
    server: ServerProcess, rounds: int, hogs: bool, one_round: Callable[[], Awaitable[LoopResult]]
) -> LoopResult:
    """``rounds`` runs of ``one_round`` (each its own event loop, hogs around it), pooled."""

    async def one() -> LoopResult:
        with CpuHogs(hogs) as hog, CpuWatch(server.proc.pid, *hog.pids) as cpu:
            result = await one_round()
            result.hogs = len(hog.pids)
        result.background_cores = [cpu.others_cores]
        return result

    results = [anyio.run(one, backend="asyncio", backend_options={"use_uvloop": True}) for _ in range(rounds)]
    return LoopResult.pooled(results)


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of run summaries."""
    head = (
        "| design | where | fps | hogs | ticks/expected | missed | tick lateness p50/p99/max ms | RT "
        "| p99 per round | control process cores per round | encode p50 | transport p50 | queue wait p50 "
        "| inference p50 | rtt p50/p99 | merge p50 ms | other processes' cores per round |"
    )
    lines = [head, "|" + "---|" * 17]
    for r in rows:
        j = r["lateness_ms"]
        lines.append(
            f"| {r['design']} | {r['where']} | {r['fps']:g} | {r['hogs']} | {r['ticks']}/{r['expected_ticks']} "
            f"| {r['missed_deadlines']} | {j['p50']}/{j['p99']}/{j['max']} | {r['realtime']} "
            f"| {r['round_lateness_p99_ms']} | {r['control_process_cores']} | {r['encode_ms']['p50']} "
            f"| {r['transport_ms']['p50']} | {r['queue_wait_ms']['p50']} | {r['inference_ms']['p50']} "
            f"| {r['rtt_ms']['p50']}/{r['rtt_ms']['p99']} | {r['merge_ms']['p50']} | {r['background_cores']} |"
        )
    return "\n".join(lines)
