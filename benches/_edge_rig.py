"""Rig of bench_edge.py: a policy server in another process, servo's edge runtime, and the legacy
inline loop it replaces, each driving a simulated SO-100 with two 480x640 cameras.

* `ServerProcess` runs ``servo-serve`` (reference policy padded to ``compute_ms``) with an audit
  log, the server's own per-request durations (queue wait, inference) joined on (session, seq).
* `run_servo` runs `EdgeRuntime` + `RemoteEngine` for a fixed time; `EngineBase.on_merge` reports
  every merge with its duration (the ActionQueue.merge call) and the chunk's observation stamp.
* `run_naive` is seeds/000 BUG-1 on purpose: the control thread reads the robot, JPEG-encodes
  both frames, publishes and *blocks* until the chunk is back, all inline, on the same
  absolute-deadline schedule as servo's loop, so the only difference is where the I/O happens.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import anyio
import numpy as np
import numpy.typing as npt
import zenoh

from servo._core import MSG_CHUNK, MSG_OBS, SCHEMA_VERSION, ActionQueue, Header, decode_header, unauthenticated
from servo.client import PolicyClient
from servo.edge.config import EdgeConfig, load_config
from servo.edge.control_loop import request_realtime
from servo.edge.engine import MergeEvent, robot_features
from servo.edge.remote import RemoteEngine
from servo.edge.runtime import EdgeRuntime, RunOptions
from servo.edge.safety import SafetyLimiter
from servo.robots.sim import SimConfig, SimSO100
from servo.transport import ZenohSettings, declare_obs_publisher
from servo.wire import ActionChunk, Observation, decode, decode_tensor, encode, encode_image, encode_tensor

FloatArray = npt.NDArray[np.float32]

JPEG_QUALITY = 90
COMPUTE_MS = 20.0
CHUNK = 50


# ----------------------------------------------------------------------------- server


class ServerProcess:
    """``servo-serve`` in a child process (reference policy, two 480x640 cameras, audit log)."""

    def __init__(self, workdir: Path, port: int, *, compute_ms: float = COMPUTE_MS) -> None:
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
[serving]
max_sessions = 4
[zenoh]
mode = "peer"
listen = ["tcp/127.0.0.1:{port}"]
[ops]
health_port = 0
audit_log = "{self.audit}"
"""
        )
        self.log = workdir / "server.log"
        self._out = self.log.open("w")
        self.proc = subprocess.Popen(
            # info: at warning level the server's audit log stays empty (its lines are info).
            [sys.executable, "-m", "servo.cli.serve", str(self.manifest), "--log-level", "info"],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        stop = threading.Event()
        while "ready" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"servo-serve did not start:\n{self.log.read_text()}")
            stop.wait(0.05)

    def audit_records(self, session_id: int) -> dict[int, dict[str, Any]]:
        """seq_id -> audit line of one session."""
        out: dict[int, dict[str, Any]] = {}
        for line in self.audit.read_text().splitlines():
            record = json.loads(line)
            if record.get("session_id") == session_id and record.get("outcome") == "ok":
                out[int(record["seq_id"])] = record
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._out.close()


# ----------------------------------------------------------------------------- results


class CpuWatch:
    """CPU used by everything *but* this process and the server while a round runs (Linux /proc).

    The machine is shared: a round's jitter is only comparable with the background load next to it.
    """

    def __init__(self, server_pid: int) -> None:
        self._pids = (os.getpid(), server_pid)
        self.others_cores: float | None = None

    @staticmethod
    def _system() -> tuple[int, int]:
        values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return sum(values), values[3] + values[4]  # all jiffies, idle + iowait

    @staticmethod
    def _process(pid: int) -> int:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    def __enter__(self) -> Self:
        try:
            self._start = (self._system(), [self._process(p) for p in self._pids], time.monotonic())
        except (OSError, ValueError, IndexError):
            self._start = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._start is None:
            return
        try:
            (total0, idle0), procs0, t0 = self._start
            total1, idle1 = self._system()
            procs1 = [self._process(p) for p in self._pids]
        except (OSError, ValueError, IndexError):
            return
        hz = os.sysconf("SC_CLK_TCK")
        busy = (total1 - total0) - (idle1 - idle0) - sum(b - a for a, b in zip(procs0, procs1, strict=True))
        self.others_cores = round(busy / hz / (time.monotonic() - t0), 2)


@dataclass
class Breakdown:
    """One request's round trip (ms): encode + transport + queue wait + inference = rtt."""

    encode: float
    transport: float
    queue_wait: float
    inference: float
    rtt: float
    merge: float


@dataclass
class LoopResult:
    """What one run measured."""

    design: str
    fps: float
    duration_s: float
    ticks: int
    missed_deadlines: int
    jitter_ms: array[float]
    actuation_ms: list[float] = field(default_factory=list)
    requests: list[Breakdown] = field(default_factory=list)
    chunks: int = 0
    realtime: bool = False
    switch_interval_s: float = 0.0
    final_state: str = ""
    error: str = ""
    round_p99_ms: list[float] = field(default_factory=list)
    #: Cores busy with other processes during each round (the noise next to the numbers).
    background_cores: list[float | None] = field(default_factory=list)

    @classmethod
    def pooled(cls, rounds: list[LoopResult]) -> LoopResult:
        """Several rounds of the same design as one result (ticks pooled, p99 of each round kept)."""
        first = rounds[0]
        pooled = cls(
            design=first.design,
            fps=first.fps,
            duration_s=sum(r.duration_s for r in rounds),
            ticks=sum(r.ticks for r in rounds),
            missed_deadlines=sum(r.missed_deadlines for r in rounds),
            jitter_ms=array("d", [x for r in rounds for x in r.jitter_ms]),
            actuation_ms=[x for r in rounds for x in r.actuation_ms],
            requests=[x for r in rounds for x in r.requests],
            chunks=sum(r.chunks for r in rounds),
            realtime=all(r.realtime for r in rounds),
            switch_interval_s=first.switch_interval_s,
            final_state=",".join(sorted({r.final_state for r in rounds})),
            error="; ".join(r.error for r in rounds if r.error),
            background_cores=[c for r in rounds for c in r.background_cores],
        )
        pooled.round_p99_ms = [round(float(np.percentile(np.abs(np.asarray(r.jitter_ms)), 99)), 3) for r in rounds]
        return pooled

    def summary(self) -> dict[str, Any]:
        jitter = np.abs(np.asarray(self.jitter_ms, dtype=np.float64))
        out: dict[str, Any] = {
            "design": self.design,
            "fps": self.fps,
            "duration_s": round(self.duration_s, 2),
            "ticks": self.ticks,
            "expected_ticks": round(self.duration_s * self.fps),
            "missed_deadlines": self.missed_deadlines,
            "jitter_ms": _pcts(jitter),
            "actuation_ms": _pcts(np.asarray(self.actuation_ms, dtype=np.float64)),
            "chunks": self.chunks,
            "realtime": self.realtime,
            "switch_interval_ms": round(self.switch_interval_s * 1e3, 3),
            "final_state": self.final_state,
            "error": self.error,
            "round_jitter_p99_ms": self.round_p99_ms,
            "background_cores": self.background_cores,
        }
        for name in ("encode", "transport", "queue_wait", "inference", "rtt", "merge"):
            values = np.asarray([getattr(r, name) for r in self.requests], dtype=np.float64)
            out[f"{name}_ms"] = _pcts(values, points=(50, 99))
        return out


def _pcts(values: np.ndarray, points: tuple[int, ...] = (50, 99, 100)) -> dict[str, float | None]:
    names = {50: "p50", 99: "p99", 100: "max"}
    if values.size == 0:
        return {names[p]: None for p in points}
    return {names[p]: round(float(np.percentile(values, p)), 3) for p in points}


# ----------------------------------------------------------------------------- servo


class TimingRobot:
    """A SimSO100 (front + wrist, 480x640 at 30 fps) that timestamps every tick's read and send.

    Called from the control thread only; ``sends`` holds (tick index, ns from the tick's
    ``read_state`` to its ``send_action``).
    """

    def __init__(self, fps: float) -> None:
        self.sim = SimSO100(SimConfig(fps=fps))
        self.reads = 0
        self._read_ns = 0
        self.sends: list[tuple[int, int]] = []

    @property
    def spec(self) -> Any:
        return self.sim.spec

    def connect(self) -> None:
        self.sim.connect()

    def disconnect(self) -> None:
        self.sim.disconnect()

    def read_state(self) -> FloatArray:
        self._read_ns = time.monotonic_ns()
        self.reads += 1
        return self.sim.read_state()

    def read_cameras(self) -> dict[str, Any]:
        return self.sim.read_cameras()

    def send_action(self, target: FloatArray) -> None:
        self.sends.append((self.reads, time.monotonic_ns() - self._read_ns))
        self.sim.send_action(target)

    def actuation_ms(self, lateness_ms: array[float], first_read: int) -> list[float]:
        """Deadline -> command sent (ms) for every tick that sent one: tick lateness + work."""
        out = []
        for read, delta_ns in self.sends:
            k = read - first_read
            if 0 <= k < len(lateness_ms):
                out.append(lateness_ms[k] + delta_ns / 1e6)
        return out


async def run_servo(
    server: ServerProcess, fps: float, duration_s: float, *, realtime: bool, switch_interval_s: float | None
) -> LoopResult:
    """servo's edge: control thread + network worker on the event loop."""
    sim = TimingRobot(fps)
    config = load_config(flags={"connect": [f"tcp/127.0.0.1:{server.port}"], "jpeg_quality": JPEG_QUALITY})
    engine = RemoteEngine(config, sim.spec)
    # One request is in flight at a time: at merge time the session's last encode is this chunk's.
    merges: list[tuple[MergeEvent, float]] = []

    def on_merge(event: MergeEvent) -> None:
        session = engine.session
        merges.append((event, session.stats.last_encode_ms if session is not None else float("nan")))

    engine.on_merge = on_merge
    options = RunOptions(
        duration_s=duration_s, realtime=realtime, switch_interval_s=switch_interval_s, park_timeout_s=0.5
    )
    runtime = EdgeRuntime(sim, engine, config, options)
    ticks = array("d")  # every tick's lateness (ms), in order
    runtime.on_tick = lambda tick, lateness_ns: ticks.append(lateness_ns / 1e6)
    summary = await runtime.run()
    loop = runtime.loop
    assert loop is not None
    session = engine.session
    audit = server.audit_records(session.session_id) if session is not None else {}
    requests = []
    for event, encode_one in merges:
        session_id, seq = event.produced.session_id, event.produced.seq_id
        obs_ns, arrived_ns, merge_ms = event.request.obs.mono_ns, event.now_ns, event.merge_ns / 1e6
        record = audit.get(seq)
        if record is None or session is None or session_id != session.session_id:
            continue
        rtt = (arrived_ns - obs_ns) / 1e6
        queue_wait, inference = float(record["queue_wait_ms"]), float(record["inference_ms"])
        transport = rtt - queue_wait - inference - encode_one
        requests.append(Breakdown(encode_one, transport, queue_wait, inference, rtt, merge_ms))
    # Exclude the park at the end: only the ticks of the timed run count.
    n = min(len(ticks), round(duration_s * fps))
    lateness = array("d", ticks[:n])
    return LoopResult(
        design="servo" if realtime else "servo (no RT, 5 ms GIL)",
        fps=fps,
        duration_s=duration_s,
        ticks=n,
        missed_deadlines=loop.missed_deadlines,
        jitter_ms=lateness,
        actuation_ms=sim.actuation_ms(lateness, first_read=2),  # read 1 anchors the limiter
        requests=requests,
        chunks=summary.chunks_received,
        realtime=loop.realtime,
        switch_interval_s=switch_interval_s or 0.005,
        final_state=summary.final_state,
        error="" if loop.error is None else repr(loop.error),
    )


# ----------------------------------------------------------------------------- the legacy loop


class NaiveLoop:
    """Everything inline on the control thread (seeds/000 BUG-1). Owned by that thread."""

    def __init__(
        self, robot: TimingRobot, zsession: zenoh.Session, obs_key: str, action_key: str, epoch: int, session_id: bytes
    ) -> None:
        self.robot = robot
        self.period_ns = round(1e9 / robot.spec.fps)
        self.epoch = epoch
        self.session_id = session_id
        self.queue = ActionQueue(robot.spec.action_dim, rtc=True)
        self.limiter = SafetyLimiter(robot.spec)
        self.buffer_steps = EdgeConfig().buffer_time_s * robot.spec.fps
        self.jitter_ms = array("d")
        self.missed_deadlines = 0
        self.ticks = 0
        self.requests: list[Breakdown] = []
        self.error = ""
        self._seq = 0
        self._reply: tuple[Header, bytes, int] | None = None
        self._arrived = threading.Event()
        self._publisher = declare_obs_publisher(zsession, obs_key)
        self._subscriber = zsession.declare_subscriber(action_key, self._on_action)

    def _on_action(self, sample: zenoh.Sample) -> None:
        if sample.attachment is None:
            return
        header = decode_header(sample.attachment.to_bytes())
        if header.msg_type == MSG_CHUNK and header.seq_id == self._seq:
            self._reply = (header, sample.payload.to_bytes(), time.monotonic_ns())
            self._arrived.set()

    def close(self) -> None:
        self._subscriber.undeclare()
        self._publisher.undeclare()

    def run(self, duration_s: float, *, realtime: bool) -> None:
        if realtime:
            request_realtime()
        self.limiter.start_from(self.robot.read_state())
        end = time.monotonic_ns() + round(duration_s * 1e9)
        next_ns = time.monotonic_ns()
        wait = threading.Event()
        try:
            while next_ns < end:
                now = time.monotonic_ns()
                self.jitter_ms.append((now - next_ns) / 1e6)
                self._tick(now)
                self.ticks += 1
                next_ns += self.period_ns
                after = time.monotonic_ns()
                if after > next_ns:
                    late = (after - next_ns) // self.period_ns + 1
                    self.missed_deadlines += int(late)
                    next_ns += late * self.period_ns
                wait.wait((next_ns - time.monotonic_ns()) / 1e9)
        except Exception as exc:
            self.error = repr(exc)

    def _tick(self, now: int) -> None:
        state = self.robot.read_state()
        frames = self.robot.read_cameras()
        if self.queue.qsize() < self.buffer_steps:
            self._request(state, frames, now)
        action = self.queue.get()
        if action is not None:
            self.robot.send_action(self.limiter.apply(action))

    def _request(self, state: FloatArray, frames: dict[str, Any], now: int) -> None:
        started = time.perf_counter()
        images = {name: encode_image(frame, JPEG_QUALITY) for name, frame in frames.items()}
        body = encode(Observation(state=encode_tensor(state), images=images))
        encode_ms = (time.perf_counter() - started) * 1e3
        self._seq += 1
        header = Header(SCHEMA_VERSION, MSG_OBS, 0, self._seq, 0, self.epoch, now, self.session_id)
        self._arrived.clear()
        self._reply = None
        self._publisher.put(body, attachment=unauthenticated(header))
        if not self._arrived.wait(5.0) or self._reply is None:  # blocks the control loop
            return
        _, payload, arrived_ns = self._reply
        chunk = decode(payload, ActionChunk)
        model = np.asarray(decode_tensor(chunk.chunk_model, dtype="float32"), dtype=np.float32)
        robot = np.asarray(decode_tensor(chunk.chunk_robot, dtype="float32"), dtype=np.float32)
        rtt = (arrived_ns - now) / 1e6
        merge_started = time.perf_counter_ns()
        self.queue.merge(model, robot, math.ceil(rtt * 1e6 / self.period_ns))
        merge_ms = (time.perf_counter_ns() - merge_started) / 1e6
        transport = rtt - chunk.queue_wait_ms - chunk.inference_ms - encode_ms
        self.requests.append(Breakdown(encode_ms, transport, chunk.queue_wait_ms, chunk.inference_ms, rtt, merge_ms))


async def run_naive(server: ServerProcess, fps: float, duration_s: float) -> LoopResult:
    """The legacy loop against the same server (a session opened the normal way first)."""
    sim = TimingRobot(fps)
    await anyio.to_thread.run_sync(sim.connect)
    try:
        settings = ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{server.port}"])
        async with PolicyClient.connect(settings, "naive-bench") as client:
            (info,) = await client.discover()
            session = await client.open_session(info, features=robot_features(sim.spec), fps=fps, rtc=True, epoch=1)
            keys, session_id = session.keys, session.session_id.to_bytes(16, "little")
            naive = NaiveLoop(sim, client.zsession, keys.obs, keys.action, epoch=1, session_id=session_id)
            try:
                await anyio.to_thread.run_sync(lambda: naive.run(duration_s, realtime=True))
            finally:
                naive.close()
                await session.close()
    finally:
        await anyio.to_thread.run_sync(sim.disconnect)
    return LoopResult(
        design="naive (inline I/O)",
        fps=fps,
        duration_s=duration_s,
        ticks=naive.ticks,
        missed_deadlines=naive.missed_deadlines,
        jitter_ms=naive.jitter_ms,
        actuation_ms=sim.actuation_ms(naive.jitter_ms, first_read=2),
        requests=naive.requests,
        chunks=len(naive.requests),
        realtime=True,
        switch_interval_s=sys.getswitchinterval(),
        final_state="n/a",
        error=naive.error,
    )


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of run summaries."""
    head = (
        "| design | fps | ticks/expected | missed | tick jitter p50/p99/max ms | actuation p50/p99/max ms "
        "| encode p50 | transport p50 | queue wait p50 | inference p50 | rtt p50/p99 | merge p50 ms | RT "
        "| p99 per round | other processes' cores per round |"
    )
    lines = [head, "|" + "---|" * 15]
    for r in rows:
        j, a = r["jitter_ms"], r["actuation_ms"]
        lines.append(
            f"| {r['design']} | {r['fps']:g} | {r['ticks']}/{r['expected_ticks']} | {r['missed_deadlines']} "
            f"| {j['p50']}/{j['p99']}/{j['max']} | {a['p50']}/{a['p99']}/{a['max']} "
            f"| {r['encode_ms']['p50']} | {r['transport_ms']['p50']} "
            f"| {r['queue_wait_ms']['p50']} | {r['inference_ms']['p50']} "
            f"| {r['rtt_ms']['p50']}/{r['rtt_ms']['p99']} | {r['merge_ms']['p50']} | {r['realtime']} "
            f"| {r['round_jitter_p99_ms']} | {r['background_cores']} |"
        )
    return "\n".join(lines)
