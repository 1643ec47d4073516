"""Harness for the edge integration tests: configs, a merge-recording pipeline, a runtime runner
and subprocesses (servo-serve / servo-edge) whose output can be waited on.
"""

from __future__ import annotations

import itertools
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import numpy.typing as npt

from servo.edge.channel import ControlChannel, LoopState
from servo.edge.config import EdgeConfig, load_edge_config
from servo.edge.control_process import ProcessControlLoop
from servo.edge.engine import EngineBase
from servo.edge.pipeline import ChunkPipeline, MergeEvent
from servo.edge.realtime import request_realtime
from servo.edge.runtime import EdgeRuntime, RunOptions, RunSummary
from servo.policy.protocol import FloatArray as PolicyArray
from servo.policy.protocol import PolicySpec, Processor
from servo.policy.reference import make_reference_policy
from servo.robots import RobotDescription
from tests.support import cpu_hog, eventually

FloatArray = npt.NDArray[np.float32]


def edge_config(port: int, **overrides: Any) -> EdgeConfig:
    """An edge that dials the test server on ``port``, with short test-friendly timeouts."""
    values: dict[str, Any] = {
        "connect": [f"tcp/127.0.0.1:{port}"],
        "connect_timeout_s": 5.0,
        "reconnect_initial_backoff_s": 0.1,
        "reconnect_max_backoff_s": 0.5,
    }
    values.update(overrides)
    return load_edge_config(flags=values)


def small_sim(**options: Any) -> RobotDescription:
    """A simulated arm with one 48x64 camera (the in-process test server's, see tests.support.make_manifest)."""
    return RobotDescription("sim", {"cameras": "front:64x48", **options})


@dataclass(frozen=True)
class Merge:
    """One merged chunk as the pipeline saw it, and when (`time.monotonic_ns`)."""

    session_id: str
    seq_id: int
    episode_id: int
    chunk_robot: FloatArray
    trimmed: int
    at_ns: int = 0


class MergeLog:
    """Every chunk an engine merged, seen through `EngineBase.on_merge`."""

    def __init__(self) -> None:
        self.merges: list[Merge] = []

    @classmethod
    def attach(cls, engine: EngineBase) -> MergeLog:
        log = cls()
        engine.on_merge = log.record
        return log

    def record(self, event: MergeEvent) -> None:
        if event.trimmed is not None:
            produced = event.produced
            merge = Merge(
                produced.session_id,
                produced.seq_id,
                event.request.episode_id,
                produced.chunk_robot.copy(),
                event.trimmed,
                time.monotonic_ns(),
            )
            self.merges.append(merge)

    def longest_gap_s(self, since_ns: int = 0, until_ns: int | None = None) -> float:
        """The longest time without a fresh chunk merged between ``since_ns`` and ``until_ns`` (s).

        The edges of the window count as merges: a robot that got nothing after ``since_ns``
        has a gap as long as the window.
        """
        until = time.monotonic_ns() if until_ns is None else until_ns
        stamps = [since_ns, *(m.at_ns for m in self.merges if since_ns < m.at_ns < until), until]
        return max(b - a for a, b in itertools.pairwise(stamps)) / 1e9


@dataclass
class RuntimeRun:
    """A runtime running in a task; `stop` asks for the safe teardown and waits for it."""

    runtime: EdgeRuntime
    done: anyio.Event = field(default_factory=anyio.Event)
    summary: RunSummary | None = None
    error: BaseException | None = None

    async def stop(self, timeout: float = 15.0) -> RunSummary:
        self.runtime.request_stop("test done")
        with anyio.fail_after(timeout):
            await self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.summary is not None
        return self.summary


@asynccontextmanager
async def running_edge(
    robot: RobotDescription, engine: EngineBase, options: RunOptions | None = None
) -> AsyncIterator[RuntimeRun]:
    """Run an EdgeRuntime in the background until the block exits (then stop it safely)."""
    run = RuntimeRun(EdgeRuntime(robot, engine, engine.config, options or RunOptions()))

    async def go() -> None:
        try:
            run.summary = await run.runtime.run()
        except BaseException as exc:  # surfaced by stop(); the test decides what it means
            run.error = exc
        finally:
            run.done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(go)
        try:
            yield run
        finally:
            if not run.done.is_set():
                run.runtime.request_stop("test teardown")
            with anyio.fail_after(20), anyio.CancelScope(shield=True):
                await run.done.wait()


@asynccontextmanager
async def process_loop(robot: RobotDescription, pipe: ChunkPipeline) -> AsyncIterator[ProcessControlLoop]:
    """``robot`` driven by a control process on ``pipe``'s queue until the block exits (then stopped)."""
    spec = robot.spec()
    channel = ControlChannel.create(spec.action_dim, shared=True, recording=True)
    cameras = robot.build_cameras(channel)
    cameras.connect()
    loop = ProcessControlLoop(
        channel, cameras, robot, action_dim=spec.action_dim, pipeline=pipe.memory, control=pipe.control
    )
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(loop.run)
            try:
                yield loop
            finally:
                await loop.stop()
    finally:
        cameras.disconnect()


async def stop_beside_a_hog(loop: ProcessControlLoop) -> None:
    """Let ``loop`` tick beside 8 busy loops, then stop it: it must see the stop at its next tick and
    end by itself (exit code 0), however starved this process is meanwhile."""
    with cpu_hog(8):
        ticks = loop.statistics().ticks
        await eventually(lambda: loop.statistics().ticks >= ticks + 25, 60, "ticking beside the hog")
        loop.channel.request_stop()
        asked_at = loop.statistics().ticks
        await loop.stop(timeout=60)
    stats = loop.statistics()
    assert stats.state is LoopState.STOPPED
    assert stats.ticks - asked_at <= 1  # the tick in progress, if any
    assert loop.error == ""  # not ended by force


def can_be_realtime() -> bool:
    """Whether a thread of this process may switch to real-time scheduling (CAP_SYS_NICE or an rtprio limit)."""
    granted: list[bool] = []
    probe = threading.Thread(target=lambda: granted.append(request_realtime()))
    probe.start()
    probe.join()
    return granted[0]


def write_manifest(
    path: Path,
    port: int,
    *,
    revision: str = "v1",
    options: str = "cameras = {front = [48, 64]}\nchunk_size = 20",
    connect: int | None = None,
    lease_ms: int = 1000,
    extra: str = "",
) -> Path:
    """A servo-serve manifest for a subprocess server listening on ``port``.

    ``connect`` is a router's port to join; ``extra`` is appended as more tables.
    """
    joins = "" if connect is None else f'connect = ["tcp/127.0.0.1:{connect}"]'
    # Peers beside a router, on purpose (a test network): allowed explicitly.
    beside = "" if connect is None else "[security]\nlisten_beside_router = true"
    path.write_text(
        f"""
[model]
source = "reference"
revision = "{revision}"
warmup = 1
plan_forwards = 0
[model.options]
{options}
[zenoh]
mode = "peer"
listen = ["tcp/127.0.0.1:{port}"]
{joins}
lease_ms = {lease_ms}
[ops]
health_port = 0
{beside}
{extra}
"""
    )
    return path


class Proc:
    """A child process whose merged stdout/stderr lines are collected by a reader thread.

    Owned by the test; `wait_line` blocks (with a timeout) until a line containing a text shows up.
    """

    def __init__(self, argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.argv = argv
        self.lines: list[str] = []
        #: When each line was read (`time.monotonic`), in step with ``lines``.
        self.seen_at: list[float] = []
        self._cond = threading.Condition()
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.popen = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=full_env,
            cwd=cwd,
        )
        self._reader = threading.Thread(target=self._read, name="proc-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self.seen_at.append(time.monotonic())
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()
        self.popen.stdout.close()

    @property
    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_line(self, text: str, timeout: float) -> str:
        """The first line containing ``text``; fails if the process exits or time runs out."""

        def found() -> str | None:
            return next((line for line in self.lines if text in line), None)

        with self._cond:
            ok = self._cond.wait_for(lambda: found() is not None or not self._reader.is_alive(), timeout)
            line = found()
        if line is None:
            state = "exited" if self.popen.poll() is not None else "still running"
            raise AssertionError(f"{text!r} not seen within {timeout} s ({state}, ok={ok}); output:\n{self.output}")
        return line

    def wait(self, timeout: float) -> int:
        rc = self.popen.wait(timeout)
        self._reader.join(5)
        return rc

    def kill(self) -> None:
        """SIGKILL (a crash: no drain, no goodbye) and reap."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.wait(10)

    def stop(self) -> None:
        """SIGTERM (graceful), SIGKILL if it does not go."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.send_signal(signal.SIGKILL)
        self.wait(10)


def start_server(manifest: Path, timeout: float = 60.0) -> Proc:
    """``servo-serve manifest`` as a child process, returned once it says it is ready."""
    proc = Proc([sys.executable, "-m", "servo.cli.serve", str(manifest), "--log-level", "warning"])
    try:
        proc.wait_line("ready", timeout)
    except BaseException:
        proc.kill()
        raise
    return proc


def edge_argv(command_line: str) -> list[str]:
    """``servo-edge --no-status <command_line>`` (split like a shell would) as a child argv."""
    return [sys.executable, "-m", "servo.cli.edge", "--no-status", *shlex.split(command_line)]


def run_edge(command_line: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``servo-edge --no-status <command_line>`` to its exit, its output captured as text."""
    return subprocess.run(edge_argv(command_line), capture_output=True, text=True, timeout=timeout, check=False)


def first_error(exc: BaseException) -> BaseException:
    """The single exception inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


class GatedPolicy:
    """The reference policy, except that after ``budget`` chunks it blocks until released."""

    def __init__(self, **options: Any) -> None:
        self._inner = make_reference_policy(**options)
        self.budget: int | None = None  # unlimited during warm-up
        self.release = threading.Event()
        self.blocked = threading.Event()

    @property
    def spec(self) -> PolicySpec:
        return self._inner.spec

    def make_processor(self) -> Processor:
        return self._inner.make_processor()

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: PolicyArray | None) -> Any:
        if self.budget is not None:
            if self.budget <= 0:
                self.blocked.set()
                self.release.wait(60)
            self.budget -= 1
        return self._inner.predict_chunk(batch, inference_delay, prefix)

    def reset(self) -> None:
        self._inner.reset()
