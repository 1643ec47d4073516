"""Helpers shared by the benchmarks (benches never import tests; what both need is in testbed)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from servo._core import LatencyTracker
from servo.policy import Policy
from servo.server.manifest import parse_manifest
from servo.server.service import PolicyServer, ServerReady
from testbed.processes import stop

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benches" / "results"


def publish(request: pytest.FixtureRequest, text: str, name: str, *, smoke: bool) -> None:
    """Print a results table past pytest's capture; a real (not smoke) run of every case also writes
    it to results/ (a ``-k`` selection would replace the whole table with its few rows)."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print("\n" + text, flush=True)
    if not smoke and not request.config.option.keyword:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / name).write_text(text + "\n")


def results_table(
    request: pytest.FixtureRequest, render: Callable[[list[dict[str, Any]]], str], name: str
) -> Iterator[list[dict[str, Any]]]:
    """Body of a module-scoped ``table`` fixture: the tests append rows (each with ``smoke``);
    at teardown `render` them and `publish` as ``name``."""
    rows: list[dict[str, Any]] = []
    yield rows
    if rows:
        publish(request, render(rows), name, smoke=rows[0]["smoke"])


def markdown(title: str, header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A results table: ``title`` (what was measured, how), then the table of ``rows``."""
    lines = [title, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def percentiles_ms(values_ms: Iterable[float], qs: Sequence[float]) -> list[float]:
    """Quantiles ``qs`` of ``values_ms`` through the Rust LatencyTracker (servo's own); NaN when empty."""
    values = list(values_ms)
    tracker = LatencyTracker(window=max(1, len(values)))
    for v in values:
        tracker.add(max(0, int(v * 1e6)))
    got = tracker.percentiles(list(qs))
    return [float("nan")] * len(qs) if got is None else [g / 1e6 for g in got]


def bench_env() -> dict[str, str]:
    """This process's environment with the repository on ``PYTHONPATH`` (for ``python -m benches.…``)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


@contextlib.contextmanager
def ready_process(
    command: Sequence[str], what: str, *, check: bool = True
) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """Run ``command`` (in the repository, `bench_env`) until the block exits.

    Returns once the child's first stdout line starts with ``READY`` (killed after 120 s so a
    child that never gets ready cannot hang the run) and yields the child and that line's words.
    On exit: SIGTERM, then SIGKILL after 30 s; with ``check`` the exit code must be 0.
    """
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=REPO, env=bench_env())
    assert proc.stdout is not None
    timer = threading.Timer(120, proc.kill)
    timer.start()
    try:
        line = proc.stdout.readline().split()
    finally:
        timer.cancel()
    try:
        assert line[:1] == ["READY"], f"{what} did not start (exit {proc.poll()})"
        yield proc, line
    finally:
        code = stop(proc)
        proc.stdout.close()
    assert not check or code == 0, f"{what} exited with {code}"


@asynccontextmanager
async def in_process_server(port: int, policy: Policy) -> AsyncIterator[ServerReady]:
    """Serve ``policy`` on 127.0.0.1:``port`` from this process until the block exits, then drain."""
    manifest = parse_manifest(
        f"""
[model]
source = "injected"
warmup = 1
[zenoh]
listen = ["tcp/127.0.0.1:{port}"]
[ops]
health_port = 0
"""
    )
    server = PolicyServer(manifest, policy=policy)
    async with anyio.create_task_group() as tg:
        ready: ServerReady = await tg.start(server.run)
        try:
            yield ready
        finally:
            server.drain()
