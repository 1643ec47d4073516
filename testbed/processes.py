"""Child processes of tests and benchmarks: ports, teardown, memory."""

from __future__ import annotations

import os
import select
import signal
import subprocess
from pathlib import Path
from typing import Any

from servo.deploy.local import free_port as free_port  # the one definition, shared with servo-fleet


def stop(proc: subprocess.Popen[Any], grace_s: float = 30) -> int:
    """SIGTERM (the child drains), SIGKILL if it is not gone within ``grace_s``; its exit code."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def ended(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` (any process, not only a child of ours) has ended within ``timeout`` s.

    Waits on a pidfd (Linux): readable once the process has exited, zombie or reaped.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def rss_mb(pid: int | None = None) -> float:
    """Resident set size of process ``pid`` (this one by default) in MiB, from ``/proc/<pid>/status``."""
    for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS line in /proc/{pid or 'self'}/status")
