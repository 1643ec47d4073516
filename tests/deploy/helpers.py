"""Helpers for the deployment tests: a local Ray head, a liveliness watch.

The head is ``ray start --head --block`` in a temporary directory on a free port, stopped by SIGTERM
(Ray drains the node and stops its processes) and, should anything survive, by SIGKILL of every
process carrying this head's marker in its environment: ``ray stop`` is never used, since it stops
every Ray cluster on the machine. Ray resolves 127.0.0.1 to the host's outward address unless
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (its "local machine only" switch), which keeps the head,
its workers and the drivers the tests start on loopback.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
import zenoh

from servo.stages import LoopBridge
from tests.support import free_port

LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
HEAD_START_TIMEOUT_S = 60.0
HEAD_STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RayHead:
    """A running local head: the address drivers pass as ``--ray-address``, its ``ray start`` process."""

    address: str
    process: subprocess.Popen[str]
    log: list[str]


@contextmanager
def local_ray_head() -> Iterator[RayHead]:
    """Start a head, yield it, stop it (and anything it left) whatever happened."""
    # Ray's unix socket paths live under the temp dir and must fit in 107 bytes: keep it short.
    temp = Path(tempfile.mkdtemp(prefix="servo-ray-"))
    port = free_port()
    marker = ("SERVO_TEST_RAY_HEAD", uuid.uuid4().hex)
    env = {
        **os.environ,
        **LOOPBACK_ONLY,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "10",
        marker[0]: marker[1],
    }
    # Every port Ray would otherwise take from a fixed default (the agent's 52365) or pick itself
    # is chosen free, so two heads on one machine cannot collide.
    ports = [
        f"--{name}={free_port()}"
        for name in (
            "node-manager-port",
            "object-manager-port",
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "runtime-env-agent-port",
            "metrics-export-port",
        )
    ]
    command = [
        str(Path(sys.executable).with_name("ray")),
        "start",
        "--head",
        f"--port={port}",
        *ports,
        "--num-cpus=4",
        "--object-store-memory=100000000",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
        "--block",
    ]
    head = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    log: list[str] = []
    started = threading.Event()
    reader = threading.Thread(target=_read_head, args=(head, log, started), daemon=True)
    reader.start()
    try:
        with pytest.MonkeyPatch.context() as patch:
            for name, value in LOOPBACK_ONLY.items():
                patch.setenv(name, value)  # drivers started by the tests inherit it
            if not started.wait(HEAD_START_TIMEOUT_S) or head.poll() is not None:
                raise AssertionError("ray head did not start:\n" + "\n".join(log))
            yield RayHead(f"127.0.0.1:{port}", head, log)
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(HEAD_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait(5)
        _kill_marked(f"{marker[0]}={marker[1]}".encode())
        reader.join(5)
        assert head.stdout is not None
        head.stdout.close()
        shutil.rmtree(temp, ignore_errors=True)


def _read_head(head: subprocess.Popen[str], log: list[str], started: threading.Event) -> None:
    assert head.stdout is not None
    for line in head.stdout:
        log.append(line.rstrip())
        if "Ray runtime started" in line:
            started.set()
    started.set()  # the head exited: nothing to wait for


def _kill_marked(marker: bytes) -> None:
    """SIGKILL every process whose environment carries ``marker`` (this head's processes only)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            with suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


class Presence:
    """Which liveliness tokens under a selector exist, and every change, as seen on the event loop.

    The Zenoh callback only deposits into a memory stream (docs/design/zenoh.md §2); `until` applies the
    changes on the loop. ``history=True`` reports the tokens that already exist.
    """

    def __init__(self, zsession: zenoh.Session, selector: str) -> None:
        self.alive: set[str] = set()
        self.changes: list[tuple[str, bool]] = []
        self._bridge = LoopBridge()
        self._send, self._recv = anyio.create_memory_object_stream[tuple[str, bool]](1000)
        self._sub = zsession.liveliness().declare_subscriber(
            selector, lambda s: self._bridge.call(self._on, s), history=True
        )

    def _on(self, sample: zenoh.Sample) -> None:
        self._send.send_nowait((str(sample.key_expr), sample.kind == zenoh.SampleKind.PUT))

    async def until(self, predicate: Callable[[set[str]], bool], *, timeout: float) -> None:
        with anyio.fail_after(timeout):
            while not predicate(self.alive):
                key, up = await self._recv.receive()
                self.changes.append((key, up))
                if up:
                    self.alive.add(key)
                else:
                    self.alive.discard(key)

    def close(self) -> None:
        self._bridge.close()
        self._sub.undeclare()
        self._send.close()
        self._recv.close()


@contextmanager
def watching(zsession: zenoh.Session, selector: str) -> Iterator[Presence]:
    """A `Presence` watch for the duration of the block (close it before its session)."""
    watch = Presence(zsession, selector)
    try:
        yield watch
    finally:
        watch.close()
