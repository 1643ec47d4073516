"""A robot keeps streaming while a hostile peer floods its server; the server stays bounded.

Issue 8: server RSS grew 80-100 MB per hostile round of 10^5 messages, a 5 MB session open wrote
a 5 MB log line, control characters in a client id reached the console raw, and every failed
request logged a traceback. Here a real ``servo-serve`` process serves a robot while
``benches._flood`` (another process) sends 10^5 mutated observations, session opens and control
requests at its keys; the robot must see no error, keep being served, and the server's RSS and
log must stay bounded. The rtt comparison (quiet vs flood) is ``benches/bench_security.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import numpy as np
import pytest

from servo.client import PolicyClient
from testbed.processes import rss_mb, stop
from tests.server.helpers import eventually
from tests.support import client_settings

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MESSAGES = 100_000
RSS_GROWTH_LIMIT_MB = 50.0


@contextmanager
def serve(tmp_path: Path, port: int) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(
        f"""
[model]
source = "reference"
warmup = 1
[model.options]
cameras = {{front = [48, 64]}}
compute_ms = 2.0
[zenoh]
mode = "peer"
listen = ["tcp/127.0.0.1:{port}"]
[ops]
health_port = 0
"""
    )
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "servo.cli.serve", str(manifest), "--log-level", "info"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            yield proc, log
        finally:
            code = stop(proc)
    assert code == 0, log.read_text()[-2000:]


async def test_a_robot_keeps_streaming_through_a_flood_and_the_server_stays_bounded(tmp_path: Path, port: int) -> None:
    with serve(tmp_path, port) as (server, log):
        # the process warms its policy, then listens and logs "serving"
        await eventually(lambda: "] serving" in log.read_text(errors="replace"), timeout=60)
        async with PolicyClient.connect(client_settings(port), "robot", jpeg_quality=90) as client:
            found = await client.discover()
            assert found, "the server did not answer discovery"
            session = await client.open_session(found[0], features=found[0].status.policy.features, fps=30.0)
            state = np.arange(6, dtype=np.float32)
            images = {"front": np.full((48, 64, 3), 100, np.uint8)}
            served, errors = 0, []

            async def stream() -> None:
                nonlocal served
                while True:
                    try:
                        chunk = await session.infer(state, images, timeout=5)
                        assert chunk.chunk_robot.shape[1] == 6
                        served += 1
                    except Exception as exc:  # counted: the assertion below names them
                        errors.append(f"{type(exc).__name__}: {exc}")
                    await anyio.sleep(0.02)  # a robot asks at its own pace, not as fast as it can

            async with anyio.create_task_group() as tg:
                tg.start_soon(stream)
                await eventually(lambda: served >= 20, timeout=30)
                before_mb = rss_mb(server.pid)
                flood = await anyio.run_process(
                    [
                        sys.executable,
                        "-m",
                        "benches._flood",
                        "--port",
                        str(port),
                        "--prefix",
                        found[0].keys.prefix,
                        "--victim",
                        "robot",
                        "--count",
                        str(MESSAGES),
                    ],
                    cwd=REPO,
                    check=True,
                )
                during = served
                await eventually(lambda: served >= during + 20, timeout=30)
                after_mb = rss_mb(server.pid)
                tg.cancel_scope.cancel()
            await session.close()
    assert flood.stdout.decode().startswith(f"SENT {MESSAGES}")
    assert errors == []
    assert after_mb - before_mb < RSS_GROWTH_LIMIT_MB, (before_mb, after_mb)
    text = log.read_text(errors="replace")
    lines = text.splitlines()
    assert not any(c in text for c in "\x1b\x00\x07\r\u202e"), "a control character reached the log raw"
    assert max(map(len, lines)) < 4000
    assert "Traceback" not in text
    # Rate-limited: not a line per message (how many lines depends on how long the flood lasts,
    # which load moves), and at most a line per cause per second, the rest counted.
    assert len(lines) < MESSAGES // 20, len(lines)
    per_second = Counter(cause for line in lines if (cause := log_cause(line)) is not None)
    assert per_second, "no rate-limited line: nothing of the flood was refused"
    crowded = {cause: n for cause, n in per_second.items() if n > 2}  # 2: a 1 s interval straddles a second
    assert not crowded, crowded


#: A console log line: ISO timestamp, [level], event, then key=value pairs.
LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\S*\s+\[\s*(\w+)\s*\]\s+(.+?)(?:\s{2,}(.*))?$")


def log_cause(line: str) -> tuple[str, str, str] | None:
    """(second, event, reason or code) of a rate-limited line (it carries ``suppressed=``); else None."""
    match = LINE.match(line)
    if match is None or "suppressed=" not in (match[4] or ""):
        return None
    second, _, event, fields = match.groups()
    cause = re.search(r"\b(?:reason|code)=(\S+)", fields)
    return second, event.strip(), cause[1] if cause else ""
