"""CPU load on demand: busy-loop processes that keep cores busy while a test or benchmark runs.

Each hog is a child Python process spinning at normal priority. It is bounded twice, so that a
crashed or killed parent never leaves it behind: it ends by itself once its parent is gone
(checked on every turn of the loop, through ``getppid``) or after ``limit_s``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Self

#: One turn of the loop: cheap enough to keep a core busy, and it notices an orphaning at once.
_SPIN = """
import os, sys, time
parent, end = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
while os.getppid() == parent and time.monotonic() < end:
    pass
"""

#: The longest a hog may run (s): a whole slow suite at load fits; nothing runs on for days.
DEFAULT_LIMIT_S = 4 * 3600.0


class CpuHogs:
    """``count`` busy-loop processes (one per core by default) for the length of a ``with`` block.

    Owned by the thread that enters it; `start` and `stop` may also be called directly (a pytest
    session starts them in ``pytest_configure`` and stops them in ``pytest_unconfigure``).
    """

    def __init__(self, count: int | None = None, *, enabled: bool = True, limit_s: float = DEFAULT_LIMIT_S) -> None:
        self.count = (os.cpu_count() or 1) if count is None else count
        self.enabled = enabled
        self.limit_s = limit_s
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        """Start the hogs (nothing when not ``enabled``)."""
        if not self.enabled:
            return
        command = [sys.executable, "-c", _SPIN, str(os.getpid()), str(self.limit_s)]
        for _ in range(self.count):
            self.procs.append(subprocess.Popen(command, stdin=subprocess.DEVNULL))

    def stop(self) -> None:
        """Kill the hogs and reap them."""
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait(10)
        self.procs.clear()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The hogs stopped (SIGSTOP) for the length of the block.

        A benchmark's bookkeeping (starting again a server it killed) is not what it measures, and at
        load it would take minutes.
        """
        for proc in self.procs:
            proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            for proc in self.procs:
                proc.send_signal(signal.SIGCONT)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pids(self) -> list[int]:
        """The hogs' process ids."""
        return [proc.pid for proc in self.procs]
