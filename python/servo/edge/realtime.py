"""Scheduling of the control loop's threads: the tick real-time, every other thread of its process just below.

The tick thread asks for ``SCHED_FIFO`` at `REALTIME_PRIORITY` (`request_realtime`). In the control
process every other thread — a robot driver's (Cyclone DDS's receive, delivery, lease and timer
threads; Zenoh's runtime for rmw_zenoh), the parent watchdog — then goes to ``SCHED_RR`` at
`HELPER_PRIORITY` (`rank_helpers`), below the tick and above every normal thread on the machine:

* it never preempts the tick, so it cannot starve it;
* the machine's load never preempts it, so it cannot be left holding what the tick waits for (a
  DDS reader's lock during a take, the GIL) while 20 busy loops run instead: left at normal
  priority, such a thread made ticks up to 820 ms late, and made the stop wait for Cyclone's
  threads to wind down;
* round robin among themselves, so no helper keeps the others out.

Threads a helper starts later inherit its class; threads the tick starts are reset to normal
(``SCHED_RESET_ON_FORK``). Where real-time scheduling is not permitted (no ``CAP_SYS_NICE`` and an
``RLIMIT_RTPRIO`` of 0: most containers and CI runners) nothing changes: every thread stays normal,
the tick keeps its schedule as well as the machine allows, and the edge says so once.
`thread_table` lists a process's threads with their class (the control process logs it).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

#: SCHED_FIFO priority of the control loop: above every normal thread, below the kernel's own
#: real-time threads (IRQ threads run at 50).
REALTIME_PRIORITY = 10
#: SCHED_RR priority of the control process's other threads: the lowest real-time one.
HELPER_PRIORITY = 1
#: Scheduling classes by their ``os.SCHED_*`` number.
POLICIES = {os.SCHED_OTHER: "other", os.SCHED_FIFO: "fifo", os.SCHED_RR: "rr", os.SCHED_BATCH: "batch"}
POLICIES[getattr(os, "SCHED_IDLE", 5)] = "idle"
#: ``prctl`` option that names the calling thread (``PR_SET_NAME``; at most 15 bytes are kept).
_PR_SET_NAME = 15


@dataclass(frozen=True)
class ThreadInfo:
    """One thread of a process: its id, its kernel name, its scheduling class and priority."""

    tid: int
    name: str
    policy: str
    priority: int

    def __str__(self) -> str:
        return f"{self.name}:{self.policy}/{self.priority}"


def request_realtime(priority: int = REALTIME_PRIORITY) -> bool:
    """Put the calling thread under ``SCHED_FIFO`` at ``priority``; False if not permitted.

    Linux applies the policy to the calling thread only (the pid argument 0 is the thread).
    ``SCHED_RESET_ON_FORK`` keeps threads this one starts (e.g. a local policy's OpenMP workers
    when inference runs on the loop) at normal priority instead of spinning at real-time priority.
    """
    setter = getattr(os, "sched_setscheduler", None)
    if setter is None:
        return False
    try:
        setter(0, os.SCHED_FIFO | getattr(os, "SCHED_RESET_ON_FORK", 0), os.sched_param(priority))
    except OSError:
        return False
    return True


def name_thread(name: str) -> None:
    """Give the calling thread a kernel name (``top -H``, `thread_table`); best effort, Linux only."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        return


def thread_table(pid: int | None = None) -> list[ThreadInfo]:
    """Every thread of process ``pid`` (this one by default), by thread id; threads that end meanwhile are left out."""
    tasks = Path(f"/proc/{pid or os.getpid()}/task")
    table = []
    for entry in sorted(tasks.iterdir(), key=lambda path: int(path.name)):
        tid = int(entry.name)
        try:
            name = (entry / "comm").read_text().strip()
            policy = os.sched_getscheduler(tid)
            priority = os.sched_getparam(tid).sched_priority
        except (FileNotFoundError, ProcessLookupError):
            continue
        table.append(ThreadInfo(tid, name, POLICIES.get(policy & 0xFF, str(policy)), priority))
    return table


def rank_helpers(tick_tid: int, priority: int = HELPER_PRIORITY) -> list[ThreadInfo]:
    """Every thread of this process but ``tick_tid`` to ``SCHED_RR`` at ``priority``; the resulting table.

    Raises:
        PermissionError: real-time scheduling is not permitted (nothing changed then).
    """
    for thread in thread_table():
        if thread.tid == tick_tid:
            continue
        try:
            os.sched_setscheduler(thread.tid, os.SCHED_RR, os.sched_param(priority))
        except ProcessLookupError:
            continue  # it ended meanwhile
    return thread_table()
