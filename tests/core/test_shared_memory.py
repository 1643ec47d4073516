"""servo._core.SharedMemory and its views, and an ActionQueue shared by two real processes."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from servo._core import ActionQueue, Counters, Provenance, Ring, Seqlock, SharedMemory

SESSION = "0f" * 16


def run_child(code: str, memory: SharedMemory, *, stdin: str = "", timeout: float = 60.0) -> list[str]:
    """Run ``code`` in a fresh interpreter that maps ``memory`` as ``memory``; its stdout lines."""
    prelude = f"import sys\nfrom servo._core import *\nmemory = SharedMemory.attach({memory.fileno()})\n"
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        pass_fds=(memory.fileno(),),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def start_child(code: str, memory: SharedMemory) -> subprocess.Popen[str]:
    prelude = f"import sys\nfrom servo._core import *\nmemory = SharedMemory.attach({memory.fileno()})\n"
    return subprocess.Popen(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        pass_fds=(memory.fileno(),),
    )


def test_memory_is_zeroed_and_views_are_checked() -> None:
    memory = SharedMemory(100)
    assert memory.size == 104
    assert memory.shared
    assert repr(memory) == "SharedMemory(size=104, shared=True)"
    counters = memory.counters(0, 13)
    assert counters.read().tolist() == [0] * 13
    with pytest.raises(ValueError, match="offset 4 is not a multiple of 8"):
        memory.counters(4, 1)
    with pytest.raises(ValueError, match="do not fit in 104 bytes"):
        memory.ring(8, 16, 100)
    private = SharedMemory(8, shared=False)
    assert not private.shared
    with pytest.raises(ValueError, match="private memory has no file descriptor"):
        private.fileno()
    with pytest.raises(ValueError, match="size is 0"):
        SharedMemory(0)
    with pytest.raises(OSError):
        SharedMemory.attach(-1)


def test_counters() -> None:
    counters = SharedMemory(Counters.size(3)).counters(0, 3)
    assert len(counters) == 3
    assert counters.add(0) == 1
    assert counters.add(0, 5) == 6
    counters.set(1, 40)
    assert counters.max(1, 30) == 40
    assert counters.max(1, 50) == 50
    assert counters.swap(2, 7) == 0
    assert counters.read(1).tolist() == [50, 7]
    with pytest.raises(IndexError, match="counter 3 out of range"):
        counters.get(3)
    with pytest.raises(IndexError):
        counters.read(2, 5)


def test_seqlock_round_trip() -> None:
    lock = SharedMemory(Seqlock.size(12)).seqlock(0, 12)
    assert lock.version == 0
    assert lock.read() == bytes(12)
    lock.write(b"hello")
    assert lock.read() == b"hello" + bytes(7)
    lock.write(np.arange(3, dtype=np.float32))
    assert np.frombuffer(lock.read() or b"", np.float32).tolist() == [0.0, 1.0, 2.0]
    assert lock.version == 2
    with pytest.raises(ValueError, match="record of 13 bytes exceeds its 12 bytes"):
        lock.write(bytes(13))


def test_ring_round_trip() -> None:
    ring = SharedMemory(Ring.size(10, 2)).ring(0, 10, 2)
    assert (ring.record_bytes, ring.capacity, len(ring)) == (10, 2, 0)
    assert ring.pop() is None
    assert ring.push(b"first")
    assert ring.push(b"second")
    assert not ring.push(b"third")
    assert ring.dropped == 1
    assert ring.pop() == b"first" + bytes(5)
    assert ring.pop() == b"second" + bytes(4)
    assert ring.pop() is None


def test_seqlock_written_by_another_process_is_never_torn() -> None:
    memory = SharedMemory(Seqlock.size(64) + 8)
    lock = memory.seqlock(0, 64)
    done = memory.counters(Seqlock.size(64), 1)
    child = start_child(
        f"""
        lock = memory.seqlock(0, 64)
        for i in range(1, 50_001):
            lock.write(i.to_bytes(8, "little") * 8)
        memory.counters({Seqlock.size(64)}, 1).set(0, 1)
        """,
        memory,
    )
    seen, last = 0, 0
    try:
        while not done.get(0):
            record = lock.read()
            if record is None:
                continue
            words = set(struct.unpack("<8Q", record))
            assert len(words) == 1, f"torn record {words}"
            value = words.pop()
            assert value >= last
            last = value
            seen += 1
    finally:
        _, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert lock.read() == (50_000).to_bytes(8, "little") * 8
    assert seen > 0


def test_ring_between_processes_keeps_order() -> None:
    memory = SharedMemory(Ring.size(16, 8))
    ring = memory.ring(0, 16, 8)
    child = start_child(
        """
        ring = memory.ring(0, 16, 8)
        accepted = [i for i in range(20_000) if ring.push(i.to_bytes(8, "little") * 2)]
        print(len(accepted), accepted[-1])
        """,
        memory,
    )
    got: list[int] = []
    while child.poll() is None or len(ring):
        record = ring.pop()
        if record is not None:
            low, high = struct.unpack("<2Q", record)
            assert low == high
            got.append(low)
    out, err = child.communicate()
    assert child.returncode == 0, err
    accepted, last = map(int, out.split())
    assert len(got) == accepted
    assert got == sorted(got)
    assert got[-1] == last
    assert ring.dropped == 20_000 - accepted


def test_queue_consumed_by_another_process_loses_and_duplicates_nothing() -> None:
    """Append mode: this process merges tagged chunks while a child drains the queue at full
    speed: the child sees every action exactly once, in order, each with its chunk's provenance."""
    total = 6_000
    memory = SharedMemory(ActionQueue.shared_size(2, 64))
    queue = ActionQueue.create(memory, 0, 2, rtc=False, capacity=64)
    child = start_child(
        f"""
        queue = ActionQueue.attach(memory, 0)
        seen = 0
        while seen < {total}:
            item = queue.get_with_provenance()
            if item is None:
                continue
            action, provenance = item
            assert action[0] == seen and action[1] == -seen, (seen, action)
            assert provenance.seq_id <= seen <= provenance.seq_id + 6, (seen, provenance)
            assert provenance.session_id == "{SESSION}"
            seen += 1
        print("ok", seen)
        """,
        memory,
    )
    value = 0
    while value < total:
        t = min(1 + value % 7, total - value)
        rows = np.arange(value, value + t, dtype=np.float32)
        chunk = np.stack([rows, -rows], axis=1)
        try:
            queue.merge(chunk, chunk, 0, provenance=Provenance(SESSION, value, 0, value))
        except ValueError:  # full: the child catches up
            if child.poll() is not None:
                break
            continue
        value += t
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert out.split() == ["ok", str(total)]
    assert queue.statistics().actions_consumed == total
    assert queue.empty()


def test_rtc_merge_reconciles_the_other_process_s_consumption() -> None:
    """The consumer process executes actions while a request is in flight; the merge here trims
    exactly what it executed (idx_before), and the rest of the chunk reaches it."""
    memory = SharedMemory(ActionQueue.shared_size(1))
    queue = ActionQueue.create(memory, 0, 1, rtc=True)
    first = np.arange(20, dtype=np.float32)[:, None]
    queue.merge(first, first, 0)
    idx_before = queue.get_action_index()  # the observation leaves now
    lines = run_child(
        """
        import json
        queue = ActionQueue.attach(memory, 0)
        print(json.dumps([float(queue.get()[0]) for _ in range(4)]))
        """,
        memory,
    )
    assert json.loads(lines[0]) == [0.0, 1.0, 2.0, 3.0]
    second = (100 + np.arange(20, dtype=np.float32))[:, None]
    # Latency says 6 steps, but the other process executed only 4 since the snapshot.
    assert queue.merge(second, second, 6, idx_before) == 4
    assert queue.statistics().delay_mismatches == 1
    lines = run_child("print(float(ActionQueue.attach(memory, 0).get()[0]))", memory)
    assert lines == ["104.0"]
