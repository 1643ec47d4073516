"""Fewer bytes (issue 19 item 4): frames sent at the policy's input size, not the camera's.

``servo-serve`` in another process serves the reference policy with one 96x128 camera (20 ms
forwards); a robot with a 480x640 camera declares it at that size and streams through a
`PolicyClient`, Zenoh over TCP on 127.0.0.1 (``shared_memory = false`` on both ends: the bytes
cross the link). Designs, same run, same server:

* ``shrunk`` — servo: the session ack offers the policy's 96x128 and the client shrinks each
  frame to it (`servo.wire.downsize`, the server's own function) before encoding.
* ``full`` — the baseline: ``PolicyClient(downsize=False)``, every frame at 480x640, as before
  (the server shrinks it; what the policy sees is the same, see ``tests/client/test_downsize.py``).

Per codec (raw, JPEG q90): frame bytes per request (what the client encoded), the client's encode
time (shrinking included) and the round trip (observation stamp -> chunk received), medians over
the requests.

Smoke (CI): ``pytest benches/bench_downsize.py --benchmark-disable`` (5 requests per case).
Measure::

    pytest benches/bench_downsize.py --benchmark-enable --benchmark-only -s

``DOWNSIZE_BENCH_REQUESTS`` per case (default 200).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from benches._edge_rig import ServerProcess
from benches._fleet import frames as camera_like
from benches._support import markdown, results_table
from servo.client import PolicyClient
from servo.logs import configure_logging
from servo.transport import ZenohSettings
from servo.wire import CameraFeature, Features
from testbed.processes import free_port

CAMERA = (480, 640)
POLICY_INPUT = (96, 128)


def render(rows: list[dict[str, Any]]) -> str:
    title = (
        f"Frames at the policy's input size: one {CAMERA[0]}x{CAMERA[1]} camera, a policy taking "
        f"{POLICY_INPUT[0]}x{POLICY_INPUT[1]} (reference, 20 ms forwards), `servo-serve` in another process, "
        f"Zenoh TCP on 127.0.0.1 (shared memory off), medians over the requests "
        f"(machine load {os.getloadavg()[0]:.1f})."
    )
    header = ["design", "codec", "requests", "frame bytes / request", "client encode ms", "round trip ms"]
    cells = [
        [r["design"], r["codec"], r["requests"], f"{r['bytes']:,}", f"{r['encode_ms']:.2f}", f"{r['rtt_ms']:.2f}"]
        for r in rows
    ]
    return markdown(title, header, cells)


@pytest.fixture(scope="module")
def table(request: pytest.FixtureRequest) -> Iterator[list[dict[str, Any]]]:
    yield from results_table(request, render, "downsize.md")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    configure_logging("warning")
    options = f"cameras = {{front = [{POLICY_INPUT[0]}, {POLICY_INPUT[1]}]}}"
    workdir = Path(tmp_path_factory.mktemp("downsize"))
    with ServerProcess(workdir, free_port(), options=options, zenoh="shared_memory = false") as proc:
        yield proc.port


async def stream(port: int, *, downsize: bool, quality: int, requests: int) -> dict[str, Any]:
    settings = ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{port}"], shared_memory=False)
    frames = {"front": camera_like(*CAMERA, seed=0)["front"]}  # JPEG-compresses like a camera image
    async with PolicyClient.connect(settings, f"bench-{int(downsize)}", jpeg_quality=quality, downsize=downsize) as c:
        (server,) = await c.discover()
        policy = server.status.policy.features
        features = Features(policy.state_names, policy.action_names, {"front": CameraFeature(*CAMERA)})
        session = await c.open_session(server, features=features, fps=30.0)
        state = np.zeros(len(policy.state_names), np.float32)
        rtts, encodes, nbytes = [], [], []
        for i in range(requests + 3):
            result = await session.infer(state, frames, timeout=10)
            if i >= 3:  # warm-up: the encoder threads start, the link settles
                rtts.append(result.rtt_ns / 1e6)
                encodes.append(session.stats.last_encode_ms)
                nbytes.append(sum(session.codec_status().bytes.values()))
        await session.close()
    return {
        "design": "shrunk" if downsize else "full",
        "codec": "raw" if quality == 0 else f"jpeg{quality}",
        "requests": requests,
        "bytes": int(statistics.median(nbytes)),
        "encode_ms": statistics.median(encodes),
        "rtt_ms": statistics.median(rtts),
    }


@pytest.mark.parametrize("quality", [0, 90], ids=["raw", "jpeg90"])
@pytest.mark.parametrize("downsize", [True, False], ids=["shrunk", "full"])
def test_bytes_per_request(
    benchmark: BenchmarkFixture, server: int, table: list[dict[str, Any]], downsize: bool, quality: int
) -> None:
    benchmark.group = f"bytes per request {'raw' if quality == 0 else 'jpeg90'}"
    requests = 5 if benchmark.disabled else int(os.environ.get("DOWNSIZE_BENCH_REQUESTS", "200"))

    def run() -> dict[str, Any]:
        return anyio.run(
            lambda: stream(server, downsize=downsize, quality=quality, requests=requests),
            backend="asyncio",
            backend_options={"use_uvloop": True},
        )

    row = benchmark.pedantic(run, rounds=1, iterations=1)
    table.append({**row, "smoke": benchmark.disabled})
    benchmark.extra_info.update(row)
    expected = POLICY_INPUT if downsize else CAMERA
    raw_bytes = expected[0] * expected[1] * 3
    benchmark.extra_info["correct"] = row["bytes"] == raw_bytes if quality == 0 else 0 < row["bytes"] < raw_bytes
    assert benchmark.extra_info["correct"], row
