"""Smoothness under latency: sync vs rtc vs remote on the sim arm (issue 5's study).

A deterministic policy whose chunks follow a known smooth reference trajectory (a path walked
at constant speed) drives the simulated SO-100 through the real edge runtime (control loop,
engines, recording). For each engine and injected inference latency we measure the tracking
error against the reference *in time* (where the arm should be at t), the largest jump between
consecutive commands, time without a fresh action, and time to finish.

Run it standalone to regenerate ``benches/results/smoothness.{md,json,png}``::

    .venv/bin/python -m benches.smoothness
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import msgspec
import numpy as np

from benches._support import in_process_server
from servo.edge.actions import ControlConfig
from servo.edge.config import EdgeConfig, LinkConfig
from servo.edge.engine import EngineBase
from servo.edge.local import RtcEngine, SyncEngine
from servo.edge.pipeline import PipelineConfig
from servo.edge.remote import RemoteEngine
from servo.edge.runtime import EdgeRuntime, RunOptions
from servo.policy.protocol import DecodedObservation, FloatArray, PolicySpec, Prepared
from servo.recording import read_recording
from servo.robots import RobotDescription
from servo.wire import Features
from testbed.processes import free_port

RESULTS = Path(__file__).parent / "results"
ENGINES = ("sync", "rtc", "remote")
LATENCIES_MS = (0, 50, 150, 300)
PAN_START, PAN_END = -40.0, 40.0
#: Nominal time to walk the reference path.
DURATION_S = 6.0


def reference(progress: np.ndarray) -> np.ndarray:
    """The path, as joint positions for progress values in [0, 1] (shape (N, 6))."""
    s = np.clip(np.asarray(progress, dtype=np.float64), 0.0, 1.0)
    return np.stack(
        [
            PAN_START + (PAN_END - PAN_START) * s,
            20.0 * np.sin(2 * math.pi * s),
            15.0 * np.sin(4 * math.pi * s),
            10.0 * np.cos(2 * math.pi * s),
            np.zeros_like(s),
            50.0 + 30.0 * np.sin(2 * math.pi * s),
        ],
        axis=1,
    )


def progress_of(position: np.ndarray) -> float:
    """Where along the path a pose is (the pan joint moves monotonically)."""
    return float(np.clip((position[0] - PAN_START) / (PAN_END - PAN_START), 0.0, 1.0))


class _Identity:
    """Absolute actions: nothing to cache between pre- and post-processing."""

    def preprocess(self, obs: DecodedObservation) -> Prepared:
        return Prepared(batch=np.asarray(obs.state, dtype=np.float32), prefix=obs.prefix_model)

    def postprocess(self, chunk: FloatArray) -> FloatArray:
        return chunk

    def reset(self) -> None:
        pass


class PathPolicy:
    """Chunks that walk the reference path at constant progress speed, taking ``latency_ms``.

    RTC-aware: with a prefix, the new chunk continues from the action that will be executing
    when it lands (``prefix[delay - 1]``) instead of from the (older) observed state.
    """

    def __init__(
        self,
        joint_names: list[str],
        *,
        fps: float,
        duration_s: float,
        latency_ms: float,
        chunk_size: int = 50,
    ) -> None:
        self._spec = PolicySpec(
            model="bench/path",
            revision="1",
            features=Features(state_names=joint_names, action_names=joint_names, cameras={}),
            chunk_size=chunk_size,
            fps=fps,
            supports_rtc=True,
            chunk_stateless=True,
        )
        self._step = 1.0 / (duration_s * fps)
        self._latency_s = latency_ms / 1000.0

    @property
    def spec(self) -> PolicySpec:
        return self._spec

    def make_processor(self) -> _Identity:
        return _Identity()

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: FloatArray | None) -> FloatArray:
        started = time.perf_counter()
        k = np.arange(1, self._spec.chunk_size + 1)
        if prefix is not None and len(prefix) and inference_delay > 0:
            anchor = prefix[min(inference_delay, len(prefix)) - 1]
            s0 = progress_of(anchor) - (min(inference_delay, len(prefix)) - 1) * self._step
            chunk = reference(s0 + (k - 1) * self._step)
        else:
            chunk = reference(progress_of(batch) + k * self._step)
        remaining = self._latency_s - (time.perf_counter() - started)
        if remaining > 0:
            time.sleep(remaining)
        return chunk.astype(np.float32)

    def reset(self) -> None:
        pass


@dataclass
class RunResult:
    engine: str
    latency_ms: int
    rms_error: float
    max_error: float
    max_jump: float
    stalled_s: float
    finish_s: float | None
    chunks: int


async def run_one(
    engine_name: str, latency_ms: int, *, duration_s: float, cap_s: float
) -> tuple[RunResult, np.ndarray]:
    """One run on the sim arm; returns the metrics and the executed commands (T, 6)."""
    sim = RobotDescription("sim", {"cameras": "none", "initial_pose": reference(np.zeros(1))[0].tolist()})
    spec = sim.spec()
    policy = PathPolicy(list(spec.joint_names), fps=spec.fps, duration_s=duration_s, latency_ms=latency_ms)
    with tempfile.TemporaryDirectory() as tmp:
        record = str(Path(tmp) / "run.servo")
        # The slew limiter would turn any jump into a ramp; lift it (beyond what a user may set, so
        # the loop runs on a thread: the control process accepts only a user's bounds) so the merge
        # itself is measured.
        options = RunOptions(duration_s=cap_s, record_path=record, control_loop="thread")
        base = EdgeConfig(
            pipeline=PipelineConfig(rtc=True, buffer_time_s=0.5, execution_horizon=20),
            control=ControlConfig(max_action_age_s=5.0, velocity_scale=100.0),
        )
        if engine_name == "remote":
            port = free_port()
            async with in_process_server(port, policy):
                config = msgspec.structs.replace(base, link=LinkConfig(connect=[f"tcp/127.0.0.1:{port}"]))
                engine: EngineBase = RemoteEngine(config, spec)
                summary = await EdgeRuntime(sim, engine, config, options).run()
        else:
            cls = SyncEngine if engine_name == "sync" else RtcEngine
            engine = cls(base, spec, policy=policy)
            summary = await EdgeRuntime(sim, engine, base, options).run()
        recording = read_recording(record)
    frames = [f for f in recording.frames if f.source in ("policy", "fallback") and f.action is not None]
    commands = np.array([np.frombuffer(f.action.data, dtype="<f4") for f in frames if f.action is not None])
    # Wall time, not tick count: a sync engine blocks the loop, so ticks stop while time runs.
    times = (np.array([f.mono_ns for f in frames], dtype=np.float64) - frames[0].mono_ns) / 1e9
    on_time = reference(np.clip(times / duration_s, 0.0, 1.0))
    errors = np.linalg.norm(commands - on_time, axis=1)
    jumps = np.abs(np.diff(commands, axis=0)).max(axis=1) if len(commands) > 1 else np.array([0.0])
    done = np.nonzero(commands[:, 0] >= PAN_END - 0.5)[0]
    result = RunResult(
        engine=engine_name,
        latency_ms=latency_ms,
        rms_error=float(np.sqrt(np.mean(errors**2))),
        max_error=float(np.max(errors)),
        max_jump=float(np.max(jumps)),
        stalled_s=(summary.fallback_ticks + summary.missed_deadlines) / spec.fps,
        finish_s=None if not len(done) else float(times[done[0]]),
        chunks=summary.chunks_received,
    )
    return result, np.column_stack([times, commands])


async def study(
    latencies: tuple[int, ...] = LATENCIES_MS, *, duration_s: float = DURATION_S
) -> tuple[list[RunResult], dict[tuple[str, int], np.ndarray]]:
    """Every engine at every latency, one after the other (they share the 2 cores)."""
    results, traces = [], {}
    for latency in latencies:
        for name in ENGINES:
            result, trace = await run_one(name, latency, duration_s=duration_s, cap_s=duration_s * 2.2 + 1.0)
            results.append(result)
            traces[(name, latency)] = trace
    return results, traces


def write_results(
    results: list[RunResult],
    traces: dict[tuple[str, int], np.ndarray],
    out: Path = RESULTS,
    *,
    duration_s: float = DURATION_S,
) -> None:
    """Markdown table, JSON and one PNG under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "smoothness.json").write_text(json.dumps([asdict(r) for r in results], indent=2))
    lines = [
        "| engine | latency ms | RMS tracking error (deg) | max tracking error (deg) | max jump (deg/tick) "
        "| no fresh action (s) | time to finish (s) | chunks |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        finish = "did not finish" if r.finish_s is None else f"{r.finish_s:.2f}"
        lines.append(
            f"| {r.engine} | {r.latency_ms} | {r.rms_error:.2f} | {r.max_error:.2f} | {r.max_jump:.2f} | "
            f"{r.stalled_s:.2f} | {finish} | {r.chunks} |"
        )
    (out / "smoothness.md").write_text("\n".join(lines) + "\n")
    _plot(traces, out / "smoothness.png", duration_s)


def _plot(traces: dict[tuple[str, int], np.ndarray], path: Path, duration_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    latencies = sorted({lat for _, lat in traces})
    fig, axes = plt.subplots(len(latencies), 1, figsize=(9, 2.4 * len(latencies)), sharex=True, squeeze=False)
    colors = {"sync": "tab:red", "rtc": "tab:blue", "remote": "tab:green"}
    end = max(float(trace[-1, 0]) for trace in traces.values() if len(trace))
    finish = max(
        (float(trace[np.argmax(trace[:, 1] >= PAN_END - 0.5), 0]) for trace in traces.values() if len(trace)),
        default=end,
    )
    for ax, latency in zip(axes[:, 0], latencies, strict=True):
        t = np.linspace(0.0, duration_s, 400)
        ax.plot(t, reference(t / duration_s)[:, 1], color="black", ls="--", lw=1.0, label="reference")
        ax.set_xlim(0.0, min(end, finish + 0.5))
        for name in ENGINES:
            trace = traces.get((name, latency))
            if trace is not None and len(trace):
                ax.plot(trace[:, 0], trace[:, 2], color=colors[name], label=name, lw=1.2)
        ax.set_ylabel("shoulder_lift (deg)")
        ax.set_title(f"injected inference latency {latency} ms", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    from servo.logs import configure_logging

    configure_logging("info")
    res, tr = anyio.run(study, backend="asyncio", backend_options={"use_uvloop": True})
    write_results(res, tr)
    print((RESULTS / "smoothness.md").read_text())
