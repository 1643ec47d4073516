"""CPU accounting for the benchmarks (Linux): who used how many cores (the hogs: `testbed.load`)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Self


class CpuWatch:
    """CPU used by everything *but* this process, the server and the hogs while a round runs (Linux).

    The machine is shared: a round's lateness is only comparable with the background load next to
    it. The edge's control process counts as background here (it uses a few % of a core).
    """

    def __init__(self, *pids: int) -> None:
        self._pids = (os.getpid(), *pids)
        self.others_cores: float | None = None

    @staticmethod
    def _system() -> tuple[int, int]:
        values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return sum(values), values[3] + values[4]  # all jiffies, idle + iowait

    @staticmethod
    def process_jiffies(pid: int) -> int:
        """CPU time (user + system, in clock ticks) process ``pid`` used so far."""
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    def __enter__(self) -> Self:
        try:
            self._start = (self._system(), [self.process_jiffies(p) for p in self._pids], time.monotonic())
        except (OSError, ValueError, IndexError):
            self._start = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._start is None:
            return
        try:
            (total0, idle0), procs0, t0 = self._start
            total1, idle1 = self._system()
            procs1 = [self.process_jiffies(p) for p in self._pids]
        except (OSError, ValueError, IndexError):
            return
        hz = os.sysconf("SC_CLK_TCK")
        busy = (total1 - total0) - (idle1 - idle0) - sum(b - a for a, b in zip(procs0, procs1, strict=True))
        self.others_cores = round(busy / hz / (time.monotonic() - t0), 2)
