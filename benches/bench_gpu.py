"""`make gpu-check` in smoke mode (CI, no GPU): the one command the GPU check runs must work.

On a CUDA machine run ``make gpu-check`` (``python -m benches.gpu_check``) itself: it measures;
this only proves the script, its server and its clients run end to end and print the table.
"""

from __future__ import annotations

import subprocess
import sys

from benches._support import REPO, bench_env


def test_gpu_check_runs_end_to_end_and_prints_one_table() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benches.gpu_check", "--smoke", "--budget-s", "150"],
        cwd=REPO,
        env=bench_env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| reference")]
    assert len(rows) == 1, done.stdout
    assert "frames=" in rows[0]
    assert rows[0].endswith("| True |")
