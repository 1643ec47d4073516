"""The capacity plan's forward time against the forwards the same server then serves.

The policy's cost is known and uneven: a 100 ms forward, and a 20 ms one every fifth (sleeps, so
the machine's load stretches both alike). The plan takes the median of ten forwards timed after the
warm-up, so it says 100 ms as the served forwards do; the fastest of a few warm-ups (the old plan)
said 20 ms. Compared as a ratio, which a busy scheduler moves far less than either figure.
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest

from servo.client import SyncPolicyClient
from tests.edge.harness import Proc
from tests.support import free_port

POLICY = """
import numpy as np
from tests.server.policies import CostCyclePolicy
def make(**options):
    # The warm-up's second forward is the fast one: the fastest warm-up would say 20 ms.
    return CostCyclePolicy([100, 20, 100, 100, 100], cameras={"front": (24, 32)}, chunk_size=20)
"""


@pytest.mark.slow
def test_the_plan_agrees_with_the_served_forwards(tmp_path: Path) -> None:
    (tmp_path / "known_cost.py").write_text(POLICY)
    port = free_port()
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(
        f'[model]\nsource = "known_cost:make"\nwarmup = 2\n'
        f'[zenoh]\nlisten = ["tcp/127.0.0.1:{port}"]\n[ops]\nhealth_port = 0\n'
    )
    server = Proc([sys.executable, "-m", "servo.cli.serve", str(manifest), "--log-level", "warning"])
    try:
        server.wait_line("servo-serve: ready", 120)
        line = server.wait_line("servo-serve: forward ", 1)
        with SyncPolicyClient(f"tcp/127.0.0.1:{port}") as policy:
            frame = np.zeros((24, 32, 3), np.uint8)
            served = [
                policy.infer({"state": np.zeros(6, np.float32), "images": {"front": frame}})["policy_timing"][
                    "infer_ms"
                ]
                for _ in range(15)
            ]
    finally:
        server.stop()
    found = re.match(r"servo-serve: forward (\S+) ms median, p90 (\S+) ms \(10 timed after warm-up on cpu", line)
    assert found is not None, line
    planned, p90 = float(found.group(1)), float(found.group(2))
    assert 0.8 <= planned / statistics.median(served) <= 1.25, (planned, served)
    assert p90 >= planned
