"""``servo-serve`` as a real process: SIGTERM drains, a bad manifest is one line and exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
import zenoh
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream

from servo.client import PolicyClient, SessionLost, TrustedServers
from servo.identity import load_identity
from servo.wire import fingerprint
from tests.server.helpers import connected, observation
from tests.support import client_settings, free_port

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]


def serve_command(manifest: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "servo.cli.serve", str(manifest), *args]


def reference_manifest(port: int, *, compute_ms: float) -> str:
    return f"""
[model]
source = "reference"
warmup = 0
[model.options]
cameras = {{front = [24, 32]}}
compute_ms = {compute_ms}
[serving]
app = "cli"
[zenoh]
listen = ["tcp/127.0.0.1:{port}"]
[ops]
health_port = 0
"""


class Lines:
    """Lines of a child's stderr, read as they come (the waits are on the pipe, not on sleeps)."""

    def __init__(self, process: Process) -> None:
        assert process.stderr is not None
        self._stream = TextReceiveStream(process.stderr)
        self._buffer = ""
        self.seen: list[str] = []

    async def until(self, predicate: object, *, timeout: float) -> str:
        with anyio.fail_after(timeout):
            while True:
                while "\n" in self._buffer:
                    line, self._buffer = self._buffer.split("\n", 1)
                    self.seen.append(line)
                    if predicate(line):  # type: ignore[operator]
                        return line
                try:
                    self._buffer += await self._stream.receive()
                except anyio.EndOfStream:
                    raise AssertionError("servo-serve exited; stderr:\n" + "\n".join(self.seen)) from None

    async def rest(self, *, timeout: float) -> list[str]:
        with anyio.fail_after(timeout):
            async for chunk in self._stream:
                self._buffer += chunk
        self.seen.extend(line for line in self._buffer.split("\n") if line)
        self._buffer = ""
        return self.seen


@asynccontextmanager
async def serve_process(manifest: Path, *args: str) -> AsyncIterator[tuple[Process, Lines]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = await anyio.open_process(
        serve_command(manifest, *args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO, env=env
    )
    try:
        yield process, Lines(process)
    finally:
        if process.returncode is None:
            process.kill()
        with anyio.move_on_after(10, shield=True):
            await process.wait()
        await process.aclose()


def is_event(name: str) -> object:
    def match(line: str) -> bool:
        try:
            return bool(json.loads(line).get("event") == name)
        except ValueError:
            return False

    return match


@pytest.mark.slow
async def test_sigterm_tells_clients_at_once_and_drains_the_request_in_flight(tmp_path: Path) -> None:
    port = free_port()
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(reference_manifest(port, compute_ms=3000))
    async with serve_process(manifest, "--log-level", "debug", "--json-logs") as (process, lines):
        await lines.until(lambda line: "servo-serve: ready" in line, timeout=60)
        async with connected(port, "robot") as client:
            (server,) = await client.discover(app="cli")
            session = await client.open_session(
                server, features=server.status.policy.features, fps=server.status.policy.fps
            )
            await session.send(*observation(5.0))
            await lines.until(is_event("inference started"), timeout=10)  # the worker has it
            process.send_signal(signal.SIGTERM)
            # The notice arrives while the 3 s forward still runs: the client can fail over now.
            with anyio.fail_after(2):
                await session.lost.wait()
            assert session.lost_reason == "server draining"
            with pytest.raises(SessionLost):
                await session.send(*observation(5.0))
            await session.close()
        with anyio.fail_after(15):
            assert await process.wait() == 0
        output = await lines.rest(timeout=5)
    assert any(is_event("drained")(line) and json.loads(line)["in_flight_finished"] for line in output)
    assert any("servo-serve: stopped" in line for line in output)


@pytest.mark.slow
async def test_second_sigterm_stops_without_waiting_for_a_hung_forward(tmp_path: Path) -> None:
    port = free_port()
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(reference_manifest(port, compute_ms=60_000))
    async with serve_process(manifest, "--log-level", "debug", "--json-logs") as (process, lines):
        await lines.until(lambda line: "servo-serve: ready" in line, timeout=60)
        async with connected(port, "robot") as client:
            (server,) = await client.discover(app="cli")
            session = await client.open_session(
                server, features=server.status.policy.features, fps=server.status.policy.fps
            )
            withdrawn = threading.Event()
            watcher = client.zsession.liveliness().declare_subscriber(
                server.keys.alive, lambda s: withdrawn.set() if s.kind == zenoh.SampleKind.DELETE else None
            )
            await session.send(*observation(5.0))
            await lines.until(is_event("inference started"), timeout=10)  # the forward hangs now
            process.send_signal(signal.SIGTERM)
            with anyio.fail_after(5):
                await session.lost.wait()
            assert session.lost_reason == "server draining"
            # The token goes too, while the forward still hangs: edges that missed the notice fail over.
            assert await anyio.to_thread.run_sync(withdrawn.wait, 5)
            assert process.returncode is None
            watcher.undeclare()
            await session.close()
        process.send_signal(signal.SIGTERM)
        await lines.until(lambda line: "interrupted again" in line, timeout=5)
        with anyio.fail_after(15):
            assert await process.wait() == 0
        output = await lines.rest(timeout=5)
    assert any(is_event("drained")(line) and not json.loads(line)["in_flight_finished"] for line in output)
    assert not any("Traceback" in line for line in output), "\n".join(output)


BAD_MANIFESTS = {
    "unknown key": (
        '[model]\nsource = "reference"\n[serving]\nmax_session = 3\n',
        "serving.max_session: unknown key",
    ),
    "wrong type": (
        '[model]\nsource = "reference"\n[serving]\nmax_sessions = "eight"\n',
        "serving.max_sessions = 'eight': expected int, got str",
    ),
    "missing model": ('[serving]\napp = "x"\n', "model: required key is missing"),
    "missing model source": ("[model]\nwarmup = 1\n", "model.source: required key is missing"),
    "bad endpoint": (
        '[model]\nsource = "reference"\n[zenoh]\nlisten = ["127.0.0.1:7447"]\n',
        "zenoh.listen[0] = '127.0.0.1:7447': not an endpoint",
    ),
    "bad device": (
        '[model]\nsource = "reference"\ndevice = "tpu"\n',
        "model.device = 'tpu': must be cpu, cuda, cuda:N or mps",
    ),
    "invalid toml": ("[model\n", "invalid TOML"),
}


@pytest.mark.parametrize(("text", "message"), BAD_MANIFESTS.values(), ids=BAD_MANIFESTS.keys())
def test_bad_manifest_exits_2_with_one_line(tmp_path: Path, text: str, message: str) -> None:
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(text)
    done = subprocess.run(serve_command(manifest), capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert message in lines[0]
    assert str(manifest) in lines[0]
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_missing_manifest_file_exits_2(tmp_path: Path) -> None:
    done = subprocess.run(serve_command(tmp_path / "nope.toml"), capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"servo-serve: error: cannot read {str(tmp_path / 'nope.toml')!r}: No such file or directory"
    ]


def startup_failure(tmp_path: Path, model: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(
        f"[model]\n{model}\nwarmup = 1\n[zenoh]\nlisten = ['tcp/127.0.0.1:{free_port()}']\n[ops]\nhealth_port = 0\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        serve_command(manifest, *args), capture_output=True, text=True, timeout=120, cwd=cwd, env=env, check=False
    )


STARTUP_FAILURES = {
    "factory raises": (
        'source = "tests.server.broken_policies:make_raising"',
        "model.source 'tests.server.broken_policies:make_raising' failed to build: RuntimeError: checkpoint is corrupt",
    ),
    "bad factory option": (
        'source = "reference"\noptions = {chunk_size = -5}',
        "model.options do not fit 'reference': ValueError: chunk_size must be >= 1, got -5",
    ),
    "NaN at warm-up": (
        'source = "tests.server.broken_policies:make_nan"',
        "warm-up forward 1 of 1: policy chunk contains NaN or inf",
    ),
    "batched chunk at warm-up": (
        'source = "tests.server.broken_policies:make_batched"',
        "warm-up forward 1 of 1: policy chunk has shape (1, 10, 6), expected (10, 6)",
    ),
}


@pytest.mark.parametrize(("model", "message"), STARTUP_FAILURES.values(), ids=STARTUP_FAILURES.keys())
def test_policy_problems_at_start_are_one_line(tmp_path: Path, model: str, message: str) -> None:
    done = startup_failure(tmp_path, model)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"servo-serve: error: {message}"
    assert "Traceback" not in done.stderr


def test_a_bug_is_one_line_and_debug_shows_the_traceback(tmp_path: Path) -> None:
    model = 'source = "tests.server.broken_policies:make_spec_crash"'
    done = startup_failure(tmp_path, model)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == "servo-serve: error: unexpected KeyError: 'a bug in the adapter' (--debug shows the traceback)"
    assert "Traceback" not in done.stderr
    debug = startup_failure(tmp_path, model, "--debug")
    assert debug.returncode != 0
    assert "Traceback" in debug.stderr


def test_without_the_server_extra_says_how_to_install_it(tmp_path: Path) -> None:
    fake = tmp_path / "site"
    fake.mkdir()
    # A torch that is not installed: importing it fails the way a missing package does.
    (fake / "torch.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(
        f"[model]\nsource = 'reference'\n[zenoh]\nlisten = ['tcp/127.0.0.1:{free_port()}']\n[ops]\nhealth_port = 0\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{fake}{os.pathsep}{REPO}"}
    done = subprocess.run(serve_command(manifest), capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "servo-serve: error: serving needs torch, which is not installed: pip install 'servo-robotics[server]'"
    )


async def test_own_policy_module_next_to_the_manifest_is_importable(tmp_path: Path) -> None:
    (tmp_path / "tinypol.py").write_text(
        "from tests.server.policies import FixedComputePolicy\n"
        "def make(**options):\n    return FixedComputePolicy(compute_ms=1)\n"
    )
    port = free_port()
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(
        f'[model]\nsource = "tinypol:make"\nwarmup = 1\n[serving]\napp = "own"\n'
        f'[zenoh]\nlisten = ["tcp/127.0.0.1:{port}"]\n[ops]\nhealth_port = 0\n'
    )
    async with serve_process(manifest) as (process, lines):  # cwd is the repository, not tmp_path
        await lines.until(lambda line: "servo-serve: ready" in line, timeout=60)
        async with connected(port, "robot") as client:
            (server,) = await client.discover(app="own")
            assert server.status.policy.model == "test/policy"
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(15):
            assert await process.wait() == 0


async def test_the_identity_is_created_printed_and_pinnable(tmp_path: Path) -> None:
    (tmp_path / "tinypol.py").write_text(
        "from tests.server.policies import FixedComputePolicy\n"
        "def make(**options):\n    return FixedComputePolicy(compute_ms=1)\n"
    )
    port, key = free_port(), tmp_path / "server.key"
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(
        f'[model]\nsource = "tinypol:make"\nwarmup = 1\n[serving]\napp = "pinned"\n'
        f'[zenoh]\nlisten = ["tcp/127.0.0.1:{port}"]\n[ops]\nhealth_port = 0\n'
        f'[security]\nidentity_key = "{key}"\n'
    )
    async with serve_process(manifest) as (process, lines):
        line = await lines.until(lambda line: "servo-serve: identity ed25519:" in line, timeout=60)
        await lines.until(lambda line: "servo-serve: ready" in line, timeout=60)
        printed = line.split("identity ")[1].split(" ")[0]
        assert printed == fingerprint(load_identity(key).public_key)
        assert f"from {key}" in line
        settings = client_settings(port)
        async with PolicyClient.connect(settings, "robot", trusted=TrustedServers.parse([printed])) as client:
            (server,) = await client.discover(app="pinned")
            session = await client.open_session(server, features=server.status.policy.features, fps=30)
            await session.close()
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(15):
            assert await process.wait() == 0


@pytest.mark.slow
def test_unknown_policy_source_exits_2_without_traceback(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(
        f'[model]\nsource = "no_such_module:factory"\n[zenoh]\nlisten = ["tcp/127.0.0.1:{free_port()}"]\n'
        "[ops]\nhealth_port = 0\n"
    )
    done = subprocess.run(serve_command(manifest), capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("servo-serve: error: model.source 'no_such_module:factory'")
