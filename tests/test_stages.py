"""The hand-off vocabulary: what each shape keeps, refuses and settles, and that none blocks exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import anyio
import pytest

from servo.stages import (
    BoundedFifo,
    LoopBridge,
    NewestSlot,
    StageClosed,
    StageFull,
    StageThread,
    Superseded,
)

#: A wait that only ends early when the code under test is right (never reached when it is).
LONG_S = 30.0


def occupy(stage: StageThread) -> tuple[threading.Event, Future[bool]]:
    """A job that holds ``stage``'s thread until the returned event is set (running once this returns)."""
    started, release = threading.Event(), threading.Event()

    def hold() -> bool:
        started.set()
        return release.wait(LONG_S)

    future = stage.submit(hold)
    assert started.wait(LONG_S)
    return release, future


def test_newest_slot_keeps_the_newest_and_hands_back_what_it_displaced() -> None:
    slot: NewestSlot[int] = NewestSlot()
    assert (slot.peek(), slot.take(), slot.get(timeout=0)) == (None, None, None)
    assert slot.put(1) is None
    assert slot.put(2) == 1
    assert (slot.peek(), slot.version) == (2, 2)
    assert slot.wait_newer(1, timeout=0) == 2
    assert slot.wait_newer(2, timeout=0) is None
    assert slot.take() == 2
    assert slot.take() is None


def test_newest_slot_close_wakes_a_waiting_reader_and_refuses_later_puts() -> None:
    slot: NewestSlot[int] = NewestSlot()
    woke: list[BaseException] = []

    def reader() -> None:
        try:
            slot.get(timeout=LONG_S)
        except StageClosed as exc:
            woke.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    slot.close()
    thread.join(LONG_S)
    assert len(woke) == 1
    with pytest.raises(StageClosed):
        slot.put(3)
    kept: NewestSlot[int] = NewestSlot()
    kept.put(4)
    assert kept.close(keep=True) == []
    assert kept.get() == 4  # what it held is still taken once
    with pytest.raises(StageClosed):
        kept.get()


def test_bounded_fifo_keeps_order_refuses_when_full_and_drains_on_close() -> None:
    fifo: BoundedFifo[int] = BoundedFifo(2)
    assert fifo.put(1)
    assert fifo.put(2)
    assert not fifo.put(3)  # full: refused at once, never blocks the writer
    assert (fifo.refused, len(fifo)) == (1, 2)
    assert fifo.get() == 1
    assert fifo.put(4)
    assert fifo.close() == [2, 4]
    with pytest.raises(StageClosed):
        fifo.put(5)
    with pytest.raises(StageClosed):
        fifo.get()
    kept: BoundedFifo[int] = BoundedFifo(2)
    kept.put(6)
    assert kept.close(keep=True) == []
    assert kept.get() == 6
    with pytest.raises(StageClosed):
        kept.get()
    with pytest.raises(ValueError, match="capacity"):
        BoundedFifo(0)


def test_a_stage_runs_jobs_in_order_and_settles_each_with_its_result_or_error() -> None:
    stage = StageThread("servo-test-order")
    ran: list[int] = []
    futures = [stage.submit(ran.append, n) for n in range(5)]
    failing = stage.submit(int, "not a number")
    assert [f.result(LONG_S) for f in futures] == [None] * 5
    assert ran == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="not a number"):
        failing.result(LONG_S)
    assert stage.close(timeout=LONG_S)


def test_closing_a_stage_settles_every_pending_job_and_lets_the_running_one_finish() -> None:
    stage = StageThread("servo-test-close")
    release, running = occupy(stage)
    pending = [stage.submit(int, "1") for _ in range(3)]
    assert not stage.close()  # the running job holds the thread
    for future in pending:
        with pytest.raises(StageClosed):
            future.result(0)  # settled by close itself: nobody waits on the thread
    with pytest.raises(StageClosed):
        stage.submit(int, "2").result(0)
    assert stage.closing.is_set()
    release.set()
    assert running.result(LONG_S) is True
    assert stage.join(LONG_S)


def test_close_with_finish_runs_what_is_pending_first() -> None:
    stage = StageThread("servo-test-finish")
    release, _ = occupy(stage)
    pending = [stage.submit(str, n) for n in range(3)]
    stage.close(finish=True)
    with pytest.raises(StageClosed):
        stage.submit(str, 9).result(0)
    release.set()
    assert [f.result(LONG_S) for f in pending] == ["0", "1", "2"]
    assert stage.join(LONG_S)


def test_a_newest_wins_stage_supersedes_the_job_not_started_yet() -> None:
    stage = StageThread("servo-test-newest", newest_wins=True)
    release, _ = occupy(stage)
    older = stage.submit(str, "older")
    newer = stage.submit(str, "newer")
    with pytest.raises(Superseded):
        older.result(0)
    release.set()
    assert newer.result(LONG_S) == "newer"
    late = stage.submit(release.wait, LONG_S)
    late.result(LONG_S)
    stage.close(finish=True, timeout=LONG_S)
    assert not stage.alive


def test_a_full_stage_refuses_at_once_and_a_cancelled_job_never_runs() -> None:
    stage = StageThread("servo-test-full", capacity=1)
    release, _ = occupy(stage)
    ran: list[str] = []
    cancelled = stage.submit(ran.append, "cancelled")
    with pytest.raises(StageFull):
        stage.submit(ran.append, "refused").result(0)
    assert cancelled.cancel()
    release.set()
    assert stage.close(finish=True, timeout=LONG_S)
    assert ran == []


def test_stage_threads_are_named_daemons_also_for_the_os() -> None:
    stage = StageThread("servo-test-named")
    thread = stage.submit(threading.current_thread).result(LONG_S)
    assert (thread.name, thread.daemon) == ("servo-test-named", True)
    if sys.platform == "linux":
        native_id = stage.submit(threading.get_native_id).result(LONG_S)
        comm = Path(f"/proc/self/task/{native_id}/comm").read_text()
        assert comm.strip() == "servo-test-name"  # the kernel keeps 15 bytes
    stage.close(timeout=LONG_S)


def test_a_long_job_ends_when_it_sees_closing() -> None:
    stage = StageThread("servo-test-loop")
    turns: list[int] = []
    started = threading.Event()

    def loop() -> int:
        started.set()
        while not stage.closing.wait(0.001):
            turns.append(1)
        return len(turns)

    future: Future[int] = stage.submit(loop)
    assert started.wait(LONG_S)
    assert stage.close(timeout=LONG_S)
    assert future.result(0) == len(turns)


EXIT_SCRIPT = """
import sys, threading, time
from servo.stages import StageClosed, StageThread

stage = StageThread("servo-exit")
never = threading.Event()
stage.submit(never.wait)          # a job that never ends (a put on a dead link)
pending = stage.submit(print, "never printed")
if sys.argv[1] == "close":
    stage.close()
    try:
        pending.result()          # no timeout: settled by close, not by the blocked thread
    except StageClosed:
        print("settled", flush=True)
else:
    print("forgotten", flush=True)  # the interpreter's exit closes it
print(time.monotonic(), flush=True)
"""


@pytest.mark.parametrize("how", ["close", "forgotten"])
def test_a_blocked_stage_never_keeps_the_process_alive(how: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(EXIT_SCRIPT), how], stdout=subprocess.PIPE, text=True
    )
    out, _ = proc.communicate(timeout=LONG_S)
    ended = time.monotonic()
    said, last = out.split()
    assert said == ("settled" if how == "close" else "forgotten")
    assert proc.returncode == 0
    # From the script's last line to the process gone: the blocked thread is abandoned, not joined.
    assert ended - float(last) < 1.0


@pytest.mark.anyio
async def test_a_bridged_call_may_use_anyio_when_sniffio_is_installed() -> None:
    # With sniffio importable, anyio finds its backend through a context variable; a call
    # scheduled in the foreign thread's context used to fail with NoEventLoopError.
    pytest.importorskip("sniffio")
    bridge = LoopBridge()
    ran = anyio.Event()
    outcome: list[object] = []

    async with anyio.create_task_group() as tg:

        def on_loop() -> None:
            try:
                event = anyio.Event()  # needs the backend
                tg.start_soon(event.wait)  # needs the backend too
                event.set()
                outcome.append("ok")
            except Exception as exc:
                outcome.append(exc)
            ran.set()

        thread = threading.Thread(target=bridge.call, args=(on_loop,))
        thread.start()
        thread.join()
        with anyio.fail_after(10):
            await ran.wait()
    assert outcome == ["ok"]


@pytest.mark.anyio
async def test_a_closed_bridge_drops_later_calls() -> None:
    bridge = LoopBridge()
    ran: list[int] = []
    bridge.call(ran.append, 1)
    bridge.close()
    bridge.call(ran.append, 2)
    await anyio.wait_all_tasks_blocked()
    assert ran == [1]
