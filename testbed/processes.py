"""Child processes of tests and benchmarks: ports, teardown, memory."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Self

from servo.deploy.local import free_port as free_port  # the one definition, shared with servo-fleet


def stop(proc: subprocess.Popen[Any], grace_s: float = 30) -> int:
    """SIGTERM (the child drains), SIGKILL if it is not gone within ``grace_s``; its exit code."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def rss_mb(pid: int | None = None) -> float:
    """Resident set size of process ``pid`` (this one by default) in MiB, from ``/proc/<pid>/status``."""
    for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS line in /proc/{pid or 'self'}/status")


class CpuLoad:
    """``count`` busy-loop processes for the length of a ``with`` block (a load of ``count`` on its own).

    Bounded by construction: each loop also ends by itself after ``max_s``, so a test killed
    before its teardown leaves no hog behind for long.
    """

    def __init__(self, count: int, *, max_s: float = 300.0) -> None:
        self.count = count
        self.max_s = max_s
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Self:
        loop = f"import time\nend = time.monotonic() + {self.max_s}\nwhile time.monotonic() < end: pass"
        self.procs = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(self.count)]
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()
        self.procs.clear()
