"""Helpers shared by tests: free loopback ports, manifests, in-process servers, waiting on state."""

from __future__ import annotations

import ctypes
import subprocess
import threading
from collections.abc import AsyncIterator, Callable, Collection, Iterator
from contextlib import asynccontextmanager, contextmanager

import anyio
import numpy as np
import pytest

from servo._core import MSG_CHUNK, Header
from servo.policy import Policy
from servo.server.manifest import Manifest, parse_manifest
from servo.server.service import PolicyServer, ServerReady
from servo.server.sessions import Session
from servo.transport import ZenohSettings
from testbed.load import CpuHogs
from testbed.processes import free_port as free_port  # the one definition, shared with the benchmarks


def client_settings(port: int) -> ZenohSettings:
    """Zenoh settings of an edge connecting to a server listening on ``port``."""
    return ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{port}"])


def make_manifest(
    port: int,
    *,
    extra: str = "",
    options: str = "cameras = {front = [48, 64]}",
    zenoh: str = "",
    source: str = "reference",
) -> Manifest:
    """A manifest for an in-process test server on ``port`` (no health port, fast warm-up).

    ``zenoh`` adds lines to the ``[zenoh]`` table (e.g. a router to connect to); ``extra`` adds tables.
    """
    return parse_manifest(
        f"""
[model]
source = "{source}"
warmup = 1
plan_forwards = 0
[model.options]
{options}
[zenoh]
listen = ["tcp/127.0.0.1:{port}"]
{zenoh}
[ops]
health_port = 0
{extra}
"""
    )


@asynccontextmanager
async def running_server(
    manifest: Manifest, policy: Policy | None = None
) -> AsyncIterator[tuple[PolicyServer, ServerReady]]:
    """Run a PolicyServer in-process until the block exits, then drain it."""
    server = PolicyServer(manifest, policy=policy)
    async with anyio.create_task_group() as tg:
        ready: ServerReady = await tg.start(server.run)
        try:
            yield server, ready
        finally:
            server.drain()


def camera_frames(height: int, width: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Two camera-like RGB frames (``front``, ``wrist``): smooth gradients plus sensor noise, so
    JPEG compresses them about as much as a real camera image (pure noise would not shrink)."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None] * np.ones((1, width), np.float32)
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :] * np.ones((height, 1), np.float32)
    out = {}
    for i, name in enumerate(("front", "wrist")):
        base = np.stack([(y + x * (i + 1)) % 256, (x * 0.5 + seed) % 256, (y * 0.7) % 256], axis=-1)
        out[name] = np.clip(base + rng.normal(0, 4, size=base.shape), 0, 255).astype(np.uint8)
    return out


async def eventually(
    predicate: Callable[[], bool], timeout: float = 5.0, what: str = "condition", poll: float = 0.005
) -> None:
    """Wait until ``predicate()`` holds (checked every ``poll`` s), or fail after ``timeout`` s.

    The conditions are counters and states written by other threads (the control loop, Zenoh
    callbacks) that expose no event to wait on, so the wait re-checks them on a short period
    under a deadline; nothing ever waits a fixed time and hopes.
    """
    try:
        with anyio.fail_after(timeout):
            while not predicate():  # noqa: ASYNC110 - see the docstring
                await anyio.sleep(poll)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}") from None


async def keep_sending(
    send: Callable[[], None], done: Callable[[], bool], timeout: float = 30.0, what: str = "it", every: float = 0.05
) -> int:
    """Call ``send()`` every ``every`` s until ``done()`` holds (or fail after ``timeout`` s); how many sends.

    A peer's ``Session.put`` has Zenoh's default ``DROP`` congestion control: a message that
    waits longer than ``wait_before_drop`` for room in its transmit queue is discarded, and at
    load a large one often is. A test never counts on one put arriving: its peer keeps sending,
    as an attacker would, until what it sent shows (a counter moves).
    """
    sent = 0
    try:
        with anyio.fail_after(timeout):
            while not done():
                send()
                sent += 1
                await anyio.sleep(every)  # the sender's pace; `done` is the condition waited on
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout} s sending until {what} ({sent} sent)") from None
    return sent


def hold_gil(seconds: float) -> None:
    """Sleep without releasing the GIL (a `ctypes.PyDLL` call keeps it): every other thread of
    this process that needs it waits, as behind a thread starved while it holds the GIL."""
    ctypes.PyDLL(None).usleep(int(seconds * 1e6))


#: The longest a `cpu_hog` busy loop runs if nobody stops it (the test process died).
HOG_LIMIT_S = 300


@contextmanager
def cpu_hog(loops: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``loops`` busy-loop processes at normal priority for the length of the block (each ends by
    itself after `HOG_LIMIT_S` at the latest, or once this process is gone; the block kills them)."""
    with CpuHogs(loops, limit_s=HOG_LIMIT_S) as hogs:
        yield hogs.procs


def new_threads(before: Collection[threading.Thread]) -> list[str]:
    """Names of the threads alive now that were not in ``before`` (`threading.enumerate` then), sorted.

    What a component leaves behind, unlike a `threading.active_count` difference: threads of
    earlier tests that end meanwhile (an idle AnyIO worker, a closed Zenoh session's callback
    thread, later on a loaded machine) do not count.
    """
    return sorted(t.name for t in threading.enumerate() if t not in before)


def lose_chunks(monkeypatch: pytest.MonkeyPatch, lost: Callable[[int], bool]) -> list[int]:
    """Every server session's chunks answering a seq_id for which ``lost`` holds vanish after the put."""
    dropped: list[int] = []
    publish = Session.publish

    def put(session: Session, msg_type: int, body: bytes, request: Header | None = None) -> bool:
        if msg_type == MSG_CHUNK and request is not None and lost(request.seq_id):
            dropped.append(request.seq_id)
            return True  # what a dropping publisher tells its caller
        return publish(session, msg_type, body, request)

    monkeypatch.setattr(Session, "publish", put)
    return dropped
