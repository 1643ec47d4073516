"""servo._core.ActionQueue.

The first part ports every scenario of LeRobot's tests/policies/rtc/test_action_queue.py
(numpy instead of torch, ``rtc=`` instead of an RTCConfig, ``get_action_index()`` instead of
``last_index``, provenance instead of task labels, ``statistics().delay_mismatches`` instead of
the log line). The rest covers what servo adds: provenance, validation, capacity, lock-free
concurrency, GIL release and leaks.

Every test that builds a queue runs twice (the ``make`` fixture): on a queue in private memory,
and on a queue in `SharedMemory` seen through two handles on two mappings, the producer calls
through one and the consumer calls through the other, as the edge's two processes see it.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, cast

import numpy as np
import pytest

from servo._core import ActionQueue, Provenance, QueueError, QueueStats, SharedMemory

DIM = 6
SESSION = "5e55" * 8
Actions = dict[str, np.ndarray]
Make = Callable[..., ActionQueue]


class SplitQueue:
    """One shared queue through two handles: consumer calls go to one, everything else to the other."""

    __slots__ = ("_consumer", "_memories", "_producer")
    CONSUMER = frozenset({"get", "get_with_provenance", "qsize", "empty", "peek_provenance", "clear", "discard_chunk"})

    def __init__(self, action_dim: int, *, rtc: bool, capacity: int = 4096) -> None:
        producer_memory = SharedMemory(ActionQueue.shared_size(action_dim, capacity) + 64)
        consumer_memory = SharedMemory.attach(producer_memory.fileno())
        self._memories = (producer_memory, consumer_memory)
        self._producer = ActionQueue.create(producer_memory, 64, action_dim, rtc=rtc, capacity=capacity)
        self._consumer = ActionQueue.attach(consumer_memory, 64)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer if name in self.CONSUMER else self._producer, name)

    def __repr__(self) -> str:
        return repr(self._producer)


@pytest.fixture(params=["private", "shared"])
def make(request: pytest.FixtureRequest) -> Make:
    """Builds queues like ``ActionQueue(...)``: in private memory, or shared between two handles."""
    if request.param == "private":
        return ActionQueue
    return lambda *args, **kwargs: cast(ActionQueue, SplitQueue(*args, **kwargs))


def f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture
def sample_actions() -> Actions:
    return {
        "original": f32(50, DIM, seed=1),
        "processed": f32(50, DIM, seed=2),
        "short": f32(10, DIM, seed=3),
        "longer": f32(100, DIM, seed=4),
    }


@pytest.fixture
def queue_rtc(make: Make) -> ActionQueue:
    return make(DIM, rtc=True)


@pytest.fixture
def queue_append(make: Make) -> ActionQueue:
    return make(DIM, rtc=False)


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Switch Python threads every 10 us so that threads interleave densely and quickly."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(previous)


def prov(seq_id: int, step: int = 0) -> Provenance:
    return Provenance(session_id=SESSION, seq_id=seq_id, episode_id=2, obs_mono_ns=1_000 + seq_id, step=step)


def tagged(first: int, t: int, dim: int = 1) -> np.ndarray:
    """A (t, dim) chunk whose rows are first, first + 1, ... (every column)."""
    column = np.arange(first, first + t, dtype=np.float32)[:, None]
    return np.ascontiguousarray(np.repeat(column, dim, axis=1))


def state(q: ActionQueue) -> tuple[object, ...]:
    left = q.get_left_over()
    processed = q.get_processed_left_over()
    stats = q.statistics()
    return (
        q.qsize(),
        q.get_action_index(),
        None if left is None else left.tobytes(),
        None if processed is None else processed.tobytes(),
        q.peek_provenance(),
        stats.merges,
        stats.actions_consumed,
    )


# --------------------------------------------------------------- LeRobot: initialization


def test_initialization_rtc_enabled(make: Make) -> None:
    q = make(DIM, rtc=True)
    assert q.get_processed_left_over() is None
    assert q.get_left_over() is None
    assert q.get_action_index() == 0
    assert q.rtc is True
    assert (q.action_dim, q.capacity) == (DIM, 4096)


def test_initialization_rtc_disabled(make: Make) -> None:
    q = make(DIM, rtc=False, capacity=10)
    assert q.get_processed_left_over() is None
    assert q.get_left_over() is None
    assert q.get_action_index() == 0
    assert q.rtc is False
    assert q.capacity == 10


# ------------------------------------------------------------------------ LeRobot: get()


def test_get_returns_none_when_empty(queue_rtc: ActionQueue) -> None:
    assert queue_rtc.get() is None


def test_get_returns_actions_sequentially(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["original"], sample_actions["processed"], real_delay=0)
    action1 = queue_rtc.get()
    assert action1 is not None
    assert action1.shape == (DIM,)
    assert action1.dtype == np.float32
    np.testing.assert_array_equal(action1, sample_actions["processed"][0])
    action2 = queue_rtc.get()
    assert action2 is not None
    np.testing.assert_array_equal(action2, sample_actions["processed"][1])


def test_get_with_provenance_preserved_when_non_rtc_queue_drains(
    queue_append: ActionQueue, sample_actions: Actions
) -> None:
    """New chunks append behind old actions without relabeling the old tail."""
    a = sample_actions["processed"][:2]
    b = sample_actions["processed"][2:4]
    queue_append.merge(a, a, real_delay=0, provenance=prov(1))
    first = queue_append.get_with_provenance()
    assert first is not None
    assert first[1] == prov(1)
    queue_append.merge(b, b, real_delay=0, provenance=prov(2))
    remaining = [queue_append.get_with_provenance() for _ in range(3)]
    assert [item[1] for item in remaining if item is not None] == [prov(1, 1), prov(2, 0), prov(2, 1)]


def test_get_with_provenance_tracks_replacement_chunk(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    """RTC replacement changes provenance only when the new chunk enters the queue."""
    a = sample_actions["processed"][:2]
    b = sample_actions["processed"][2:4]
    queue_rtc.merge(a, a, real_delay=0, provenance=prov(1))
    item = queue_rtc.get_with_provenance()
    assert item is not None
    assert item[1] == prov(1)
    queue_rtc.merge(b, b, real_delay=0, provenance=prov(2))
    item = queue_rtc.get_with_provenance()
    assert item is not None
    assert item[1] == prov(2)


def test_provenance_stays_in_lockstep_with_actions(queue_append: ActionQueue) -> None:
    """LeRobot checks that a desynced label list fails loudly; servo stores one provenance per
    chunk and a per-row index into it, so desync is impossible by construction. Check that
    every action's provenance is its own chunk's across merges, partial drains and clears."""
    owner: dict[int, int] = {}
    value = 0
    checked = 0
    for seq in range(40):
        t = 1 + seq % 5
        chunk = tagged(value, t, DIM)
        queue_append.merge(chunk, chunk, real_delay=0, provenance=prov(seq))
        owner.update((v, seq) for v in range(value, value + t))
        value += t
        for _ in range(seq % 4):
            item = queue_append.get_with_provenance()
            if item is None:
                break
            action, p = item
            assert p is not None
            assert p.seq_id == owner[int(action[0])]
            checked += 1
        if seq % 13 == 12:
            queue_append.clear()
    assert checked > 40


def test_get_returns_none_after_exhaustion(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    for _ in range(10):
        assert queue_rtc.get() is not None
    assert queue_rtc.get() is None


def test_get_increments_action_index(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["original"], sample_actions["processed"], real_delay=0)
    assert queue_rtc.get_action_index() == 0
    queue_rtc.get()
    assert queue_rtc.get_action_index() == 1
    queue_rtc.get()
    assert queue_rtc.get_action_index() == 2


# ---------------------------------------------------------------- LeRobot: qsize / empty


def test_qsize_returns_zero_when_empty(queue_rtc: ActionQueue) -> None:
    assert queue_rtc.qsize() == 0


def test_qsize_returns_correct_size(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    assert queue_rtc.qsize() == 10
    queue_rtc.get()
    assert queue_rtc.qsize() == 9
    queue_rtc.get()
    assert queue_rtc.qsize() == 8


def test_qsize_after_exhaustion(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    for _ in range(10):
        queue_rtc.get()
    assert queue_rtc.qsize() == 0


def test_empty_returns_true_when_empty(queue_rtc: ActionQueue) -> None:
    assert queue_rtc.empty() is True


def test_empty_returns_false_when_not_empty(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    assert queue_rtc.empty() is False


def test_empty_after_partial_consumption(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    queue_rtc.get()
    queue_rtc.get()
    assert queue_rtc.empty() is False


def test_empty_after_full_consumption(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    for _ in range(10):
        queue_rtc.get()
    assert queue_rtc.empty() is True


# ------------------------------------------------------------- LeRobot: get_action_index


def test_get_action_index_initial_value(queue_rtc: ActionQueue) -> None:
    assert queue_rtc.get_action_index() == 0


def test_get_action_index_after_consumption(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    assert queue_rtc.get_action_index() == 0
    queue_rtc.get()
    assert queue_rtc.get_action_index() == 1
    queue_rtc.get()
    queue_rtc.get()
    assert queue_rtc.get_action_index() == 3


# ---------------------------------------------------------------- LeRobot: get_left_over


def test_get_left_over_returns_none_when_empty(queue_rtc: ActionQueue) -> None:
    assert queue_rtc.get_left_over() is None


def test_get_left_over_returns_all_when_unconsumed(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    leftover = queue_rtc.get_left_over()
    assert leftover is not None
    assert leftover.shape == (10, DIM)
    assert leftover.dtype == np.float32
    np.testing.assert_array_equal(leftover, sample_actions["short"])


def test_get_left_over_returns_remaining_after_consumption(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    for _ in range(3):
        queue_rtc.get()
    leftover = queue_rtc.get_left_over()
    assert leftover is not None
    assert leftover.shape == (7, DIM)
    np.testing.assert_array_equal(leftover, sample_actions["short"][3:])


def test_get_left_over_returns_empty_after_exhaustion(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    for _ in range(10):
        queue_rtc.get()
    leftover = queue_rtc.get_left_over()
    assert leftover is not None
    assert leftover.shape == (0, DIM)


def test_left_overs_keep_original_and_processed_apart(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["original"], sample_actions["processed"], real_delay=2)
    queue_rtc.get()
    np.testing.assert_array_equal(queue_rtc.get_left_over(), sample_actions["original"][3:])
    np.testing.assert_array_equal(queue_rtc.get_processed_left_over(), sample_actions["processed"][3:])


# -------------------------------------------------------------- LeRobot: merge with RTC


def test_merge_replaces_queue_when_rtc_enabled(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    assert queue_rtc.qsize() == 10
    queue_rtc.get()
    queue_rtc.get()
    assert queue_rtc.qsize() == 8
    trimmed = queue_rtc.merge(sample_actions["original"], sample_actions["processed"], real_delay=5)
    assert trimmed == 5
    assert queue_rtc.qsize() == 45
    assert queue_rtc.get_action_index() == 0


def test_merge_respects_real_delay(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    delay = 10
    queue_rtc.merge(sample_actions["original"], sample_actions["processed"], real_delay=delay)
    assert queue_rtc.qsize() == len(sample_actions["original"]) - delay
    first = queue_rtc.get()
    assert first is not None
    np.testing.assert_array_equal(first, sample_actions["processed"][delay])


def test_merge_resets_action_index_when_rtc_enabled(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    queue_rtc.get()
    queue_rtc.get()
    assert queue_rtc.get_action_index() == 2
    queue_rtc.merge(sample_actions["original"], sample_actions["processed"], real_delay=5)
    assert queue_rtc.get_action_index() == 0


def test_merge_with_zero_delay(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    assert queue_rtc.merge(sample_actions["original"], sample_actions["processed"], 0) == 0
    assert queue_rtc.qsize() == len(sample_actions["original"])


def test_merge_with_large_delay(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    trimmed = queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=100)
    assert trimmed == 10
    assert queue_rtc.qsize() == 0


# ----------------------------------------------------------- LeRobot: merge without RTC


def test_merge_appends_when_rtc_disabled(queue_append: ActionQueue, sample_actions: Actions) -> None:
    queue_append.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    assert queue_append.qsize() == 10
    queue_append.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    assert queue_append.qsize() == 20


def test_merge_removes_consumed_actions_when_appending(queue_append: ActionQueue, sample_actions: Actions) -> None:
    queue_append.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    for _ in range(3):
        queue_append.get()
    assert queue_append.qsize() == 7
    queue_append.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    assert queue_append.qsize() == 17
    np.testing.assert_array_equal(
        queue_append.get_left_over(),
        np.concatenate([sample_actions["short"][3:], sample_actions["short"]]),
    )


def test_merge_resets_action_index_after_append(queue_append: ActionQueue, sample_actions: Actions) -> None:
    queue_append.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    queue_append.get()
    queue_append.get()
    assert queue_append.get_action_index() == 2
    queue_append.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    assert queue_append.get_action_index() == 0


def test_merge_ignores_delay_when_rtc_disabled(queue_append: ActionQueue, sample_actions: Actions) -> None:
    trimmed = queue_append.merge(sample_actions["original"], sample_actions["processed"], real_delay=10)
    assert trimmed == 0
    assert queue_append.qsize() == len(sample_actions["original"])


def test_merge_first_call_with_rtc_disabled(queue_append: ActionQueue, sample_actions: Actions) -> None:
    queue_append.merge(sample_actions["original"], sample_actions["processed"], real_delay=0)
    assert queue_append.qsize() == len(sample_actions["original"])
    assert queue_append.get_action_index() == 0


# ------------------------------------------------------------------ LeRobot: shapes


def test_merge_with_different_action_dims(make: Make) -> None:
    q = make(4, rtc=True)
    actions = f32(20, 4)
    q.merge(actions, actions, real_delay=5)
    action = q.get()
    assert action is not None
    assert action.shape == (4,)


def test_merge_with_different_lengths(make: Make) -> None:
    q = make(DIM, rtc=False)
    q.merge(f32(10, DIM), f32(10, DIM), real_delay=0)
    assert q.qsize() == 10
    q.merge(f32(25, DIM), f32(25, DIM), real_delay=0)
    assert q.qsize() == 35


# ---------------------------------------------------------- LeRobot: delay validation


def test_merge_validates_delay_consistency(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    for _ in range(5):
        queue_rtc.get()
    # 5 consumed since index 0, latency says 3: a mismatch, counted (LeRobot logs it at
    # INFO); the delay used is min(3, 5).
    trimmed = queue_rtc.merge(sample_actions["original"], sample_actions["processed"], real_delay=3, idx_before=0)
    assert queue_rtc.statistics().delay_mismatches == 1
    assert trimmed == 3
    assert queue_rtc.qsize() == 47


def test_merge_no_mismatch_when_delays_match(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    for _ in range(5):
        queue_rtc.get()
    trimmed = queue_rtc.merge(sample_actions["original"], sample_actions["processed"], real_delay=5, idx_before=0)
    assert queue_rtc.statistics().delay_mismatches == 0
    assert trimmed == 5


def test_merge_skips_validation_when_idx_before_none(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    for _ in range(5):
        queue_rtc.get()
    trimmed = queue_rtc.merge(sample_actions["original"], sample_actions["processed"], real_delay=999, idx_before=None)
    assert queue_rtc.statistics().delay_mismatches == 0
    assert trimmed == 50
    assert queue_rtc.qsize() == 0


def test_merge_never_trims_more_than_consumed(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    """LeRobot PR #4454: the queue ran dry while the request was in flight (nothing was
    executed), so trimming real_delay steps would splice the chunk ahead of the arm."""
    queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    for _ in range(10):
        queue_rtc.get()
    idx_before = queue_rtc.get_action_index()
    assert queue_rtc.get() is None  # dry: nothing more is executed while inferring
    trimmed = queue_rtc.merge(
        sample_actions["original"], sample_actions["processed"], real_delay=5, idx_before=idx_before
    )
    assert trimmed == 0
    assert queue_rtc.statistics().delay_mismatches == 1
    first = queue_rtc.get()
    assert first is not None
    np.testing.assert_array_equal(first, sample_actions["processed"][0])


def test_negative_real_delay_counts_as_zero(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    assert queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=-4) == 0
    assert queue_rtc.qsize() == 10


def test_mismatches_are_counted_in_append_mode_too(queue_append: ActionQueue, sample_actions: Actions) -> None:
    queue_append.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    queue_append.get()
    assert queue_append.merge(sample_actions["short"], sample_actions["short"], 4, 0) == 0
    assert queue_append.statistics().delay_mismatches == 1
    assert queue_append.qsize() == 19


# ---------------------------------------------------------- LeRobot: thread safety


def test_get_is_thread_safe(queue_rtc: ActionQueue, fast_switching: None) -> None:
    """Four consumers, 25 gets each, on 100 distinct actions: each is taken exactly once."""
    actions = tagged(0, 100, DIM)
    queue_rtc.merge(actions, actions, real_delay=0)
    results: list[list[float]] = [[] for _ in range(4)]
    go = threading.Barrier(4)

    def consumer(out: list[float]) -> None:
        go.wait()
        for _ in range(25):
            action = queue_rtc.get()
            if action is not None:
                out.append(float(action[0]))

    threads = [threading.Thread(target=consumer, args=(out,)) for out in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen = sorted(v for out in results for v in out)
    assert seen == [float(v) for v in range(100)]
    assert all(out == sorted(out) for out in results)
    assert queue_rtc.qsize() == 0


def test_merge_is_thread_safe(queue_append: ActionQueue, sample_actions: Actions, fast_switching: None) -> None:
    errors: list[BaseException] = []
    go = threading.Barrier(3)

    def producer() -> None:
        go.wait()
        try:
            for _ in range(5):
                queue_append.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=producer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert queue_append.qsize() == 150
    assert queue_append.statistics().merges == 15


def test_concurrent_get_and_merge(queue_append: ActionQueue, fast_switching: None) -> None:
    """Two producers, two consumers: nothing is lost or duplicated."""
    errors: list[BaseException] = []
    consumed: list[list[float]] = [[], []]
    go = threading.Barrier(4)

    def consumer(out: list[float]) -> None:
        go.wait()
        try:
            for _ in range(50):
                action = queue_append.get()
                if action is not None:
                    out.append(float(action[0]))
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    def producer(base: int) -> None:
        go.wait()
        try:
            for i in range(10):
                chunk = tagged(base + 10 * i, 10, DIM)
                queue_append.merge(chunk, chunk, real_delay=0)
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=consumer, args=(out,)) for out in consumed]
    threads += [threading.Thread(target=producer, args=(base,)) for base in (0, 1000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    taken = [v for out in consumed for v in out]
    assert len(taken) == len(set(taken)) <= 200
    left = queue_append.get_processed_left_over()
    rest = [] if left is None else [float(v) for v in left[:, 0]]
    assert sorted(taken + rest) == sorted(float(v) for b in (0, 1000) for v in range(b, b + 100))


def test_get_left_over_is_thread_safe(queue_rtc: ActionQueue, fast_switching: None) -> None:
    actions = tagged(0, 100, DIM)
    queue_rtc.merge(actions, actions, real_delay=0)
    errors: list[BaseException] = []
    sizes: list[int] = []
    go = threading.Barrier(4)

    def reader() -> None:
        go.wait()
        try:
            for _ in range(20):
                leftover = queue_rtc.get_left_over()
                assert leftover is not None
                # A snapshot is always a suffix of the chunk.
                np.testing.assert_array_equal(leftover, actions[100 - len(leftover) :])
                sizes.append(leftover.shape[0])
        except BaseException as e:
            errors.append(e)

    def consumer() -> None:
        go.wait()
        for _ in range(10):
            queue_rtc.get()

    threads = [threading.Thread(target=reader) for _ in range(3)]
    threads.append(threading.Thread(target=consumer))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(sizes) == 60
    assert all(90 <= n <= 100 for n in sizes)


# ------------------------------------------------------------------ LeRobot: edge cases


def test_queue_with_single_action(queue_rtc: ActionQueue) -> None:
    queue_rtc.merge(f32(1, DIM, seed=5), f32(1, DIM, seed=6), real_delay=0)
    assert queue_rtc.qsize() == 1
    action = queue_rtc.get()
    assert action is not None
    assert action.shape == (DIM,)
    assert queue_rtc.qsize() == 0


def test_queue_behavior_after_multiple_merge_cycles(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    for _ in range(5):
        queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
        for _ in range(5):
            queue_rtc.get()
        queue_rtc.merge(sample_actions["original"], sample_actions["processed"], real_delay=3)
        assert queue_rtc.qsize() > 0


def test_queue_with_all_zeros_actions(queue_rtc: ActionQueue) -> None:
    zeros = np.zeros((20, DIM), np.float32)
    queue_rtc.merge(zeros, zeros, real_delay=0)
    action = queue_rtc.get()
    assert action is not None
    assert np.all(action == 0)


def test_queue_copies_inputs(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    original_copy = sample_actions["original"].copy()
    processed_copy = sample_actions["processed"].copy()
    queue_rtc.merge(sample_actions["original"], sample_actions["processed"], real_delay=0)
    sample_actions["original"].fill(999.0)
    sample_actions["processed"].fill(-999.0)
    action = queue_rtc.get()
    assert action is not None
    np.testing.assert_array_equal(action, processed_copy[0])
    np.testing.assert_array_equal(queue_rtc.get_left_over(), original_copy[1:])
    # And outputs are copies too.
    action[:] = 123.0
    np.testing.assert_array_equal(queue_rtc.get_processed_left_over(), processed_copy[1:])


def test_queue_accepts_buffers_and_strided_arrays(queue_append: ActionQueue) -> None:
    """LeRobot's GPU-tensor test has no numpy counterpart; servo's analogue is input kinds."""
    chunk = tagged(0, 4, DIM)
    queue_append.merge(chunk.data, chunk, real_delay=0)  # a memoryview
    wide = np.repeat(tagged(4, 4, DIM), 2, axis=0)[::2]  # non-contiguous view
    assert not wide.flags.c_contiguous
    queue_append.merge(wide, wide, real_delay=0)
    fortran = np.asfortranarray(tagged(8, 3, DIM))
    queue_append.merge(fortran, fortran, real_delay=0)
    left = queue_append.get_left_over()
    assert left is not None
    np.testing.assert_array_equal(left, tagged(0, 11, DIM))


def test_queue_rejects_other_dtypes(make: Make) -> None:
    """LeRobot keeps the tensor dtype; servo's contract is float32 only."""
    q = make(DIM, rtc=True)
    actions = np.random.default_rng(0).standard_normal((20, DIM))
    with pytest.raises(QueueError, match=r"original has dtype float64, expected float32"):
        q.merge(actions, actions, real_delay=0)
    assert q.qsize() == 0


def test_empty_with_fresh_queue(queue_rtc: ActionQueue) -> None:
    assert queue_rtc.get_processed_left_over() is None
    assert queue_rtc.empty() is True


def test_qsize_with_fresh_queue(queue_rtc: ActionQueue) -> None:
    assert queue_rtc.get_processed_left_over() is None
    assert queue_rtc.qsize() == 0


# ------------------------------------------------------------------ LeRobot: workflows


def test_typical_rtc_workflow(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["original"], sample_actions["processed"], real_delay=0)
    assert queue_rtc.qsize() == 50
    for _ in range(10):
        assert queue_rtc.get() is not None
    assert queue_rtc.qsize() == 40
    # Second inference: snapshot at send time, 5 more actions run while the model thinks.
    # (LeRobot's version merges with no action in between and expects 45; with the PR #4454
    # rule that would trim min(5, 0) = 0, see test_merge_never_trims_more_than_consumed.)
    idx_before = queue_rtc.get_action_index()
    for _ in range(5):
        queue_rtc.get()
    queue_rtc.merge(
        sample_actions["original"],
        sample_actions["processed"],
        real_delay=5,
        idx_before=idx_before,
    )
    assert queue_rtc.qsize() == 45
    assert queue_rtc.get_action_index() == 0
    assert queue_rtc.statistics().delay_mismatches == 0


def test_typical_non_rtc_workflow(queue_append: ActionQueue, sample_actions: Actions) -> None:
    queue_append.merge(sample_actions["original"], sample_actions["processed"], real_delay=0)
    assert queue_append.qsize() == 50
    for _ in range(40):
        assert queue_append.get() is not None
    assert queue_append.qsize() == 10
    queue_append.merge(sample_actions["original"], sample_actions["processed"], real_delay=0)
    assert queue_append.qsize() == 60


# ------------------------------------------------------------------ servo: provenance


def test_provenance_travels_with_actions(make: Make) -> None:
    q = make(2, rtc=True)
    chunk = tagged(0, 5, 2)
    q.merge(chunk, chunk, real_delay=2, provenance=prov(7, step=40))
    # Each action carries the step it is meant for: the chunk's plus its index in the chunk.
    assert q.peek_provenance() == prov(7, step=42)
    item = q.get_with_provenance()
    assert item is not None
    action, p = item
    np.testing.assert_array_equal(action, [2.0, 2.0])
    assert p == prov(7, step=42)
    assert p.obs_mono_ns == 1_007
    assert p.same_chunk(prov(7))
    assert not p.same_chunk(prov(8, step=42))
    q.merge(chunk, chunk, real_delay=0)
    assert q.peek_provenance() is None
    item = q.get_with_provenance()
    assert item is not None
    assert item[1] is None
    q.clear()
    assert q.get_with_provenance() is None
    assert q.peek_provenance() is None


def test_provenance_record() -> None:
    session = "00112233445566778899aabbccddeeff"
    p = Provenance(session_id=session, seq_id=2, episode_id=3, obs_mono_ns=-4, step=9)
    assert (p.session_id, p.seq_id, p.episode_id, p.obs_mono_ns, p.step) == (session, 2, 3, -4, 9)
    assert tuple(p) == (session, 2, 3, -4, 9)
    assert len(p) == 5
    assert p[1] == 2
    assert p[-1] == 9
    assert p[1:3] == (2, 3)
    session_id, seq_id, *_ = p
    assert (session_id, seq_id) == (session, 2)
    assert p == Provenance(session.upper(), 2, 3, -4, 9)  # the 16 bytes are what counts
    assert p != Provenance(session, 2, 3, 5, 9)
    assert p != Provenance(session, 2, 3, -4)  # another step of the same chunk
    assert p.same_chunk(Provenance(session, 2, 3, -4))
    assert hash(p) == hash(Provenance(session, 2, 3, -4, 9))
    assert repr(p) == f"Provenance(session_id='{session}', seq_id=2, episode_id=3, obs_mono_ns=-4, step=9)"
    assert pickle.loads(pickle.dumps(p)) == p
    match p:
        case Provenance(_, 2, episode_id, _, _):
            assert episode_id == 3
        case _:  # pragma: no cover
            pytest.fail("no match")
    with pytest.raises(AttributeError):
        p.seq_id = 9  # type: ignore[misc]


@pytest.mark.parametrize("session_id", ["", "00" * 15, "00" * 17, "zz" * 16, "é" * 32])
def test_provenance_session_id_is_16_bytes_of_hex(session_id: str) -> None:
    with pytest.raises(ValueError, match="is not 32 hexadecimal characters"):
        Provenance(session_id, 1, 2, 3)


def test_discard_chunk_spares_a_chunk_merged_since(queue_append: ActionQueue) -> None:
    """The staleness bound drops the rest of a stale chunk, never a fresher one behind it."""
    stale, fresh = tagged(0, 3, DIM), tagged(10, 2, DIM)
    queue_append.merge(stale, stale, real_delay=0, provenance=prov(1))
    queue_append.get()
    assert not queue_append.discard_chunk(prov(2))  # the head is still chunk 1's
    assert queue_append.qsize() == 2
    assert queue_append.discard_chunk(prov(1))
    assert queue_append.empty()
    assert queue_append.get_left_over() is None  # like clear(): no RTC prefix either
    queue_append.merge(fresh, fresh, real_delay=0, provenance=prov(2))
    assert not queue_append.discard_chunk(prov(1))
    item = queue_append.get_with_provenance()
    assert item is not None
    assert item[1] == prov(2)


def test_set_rtc_changes_the_next_merge(queue_append: ActionQueue) -> None:
    chunk = tagged(0, 10, DIM)
    queue_append.merge(chunk, chunk, real_delay=0)
    queue_append.set_rtc(True)
    assert queue_append.rtc is True
    assert queue_append.merge(chunk, chunk, real_delay=4) == 4
    assert queue_append.qsize() == 6


# ------------------------------------------------------------------ servo: validation


@pytest.mark.parametrize("rtc", [True, False])
def test_rejected_merges_name_the_problem_and_change_nothing(rtc: bool, make: Make) -> None:
    q = make(DIM, rtc=rtc, capacity=12)
    good = tagged(0, 8, DIM)
    q.merge(good, good, real_delay=1, provenance=prov(1))
    q.get()
    before = state(q)
    cases: list[tuple[Any, Any, str]] = [
        (np.zeros((50, 7), np.float32), good, r"^original has shape \(50, 7\), expected \(T, 6\)$"),
        (
            good,
            np.zeros((50, 7), np.float32),
            r"^processed has shape \(50, 7\), expected \(T, 6\)$",
        ),
        (good, good[:5], r"^processed has 5 rows, original has 8; expected the same T"),
        (np.zeros(DIM, np.float32), good, r"^original has shape \(6,\), expected \(T, 6\)$"),
        (np.zeros((1, 2, DIM), np.float32), good, r"has shape \(1, 2, 6\), expected \(T, 6\)"),
        (
            np.zeros((0, DIM), np.float32),
            good[:0],
            r"^original has shape \(0, 6\), expected T >= 1",
        ),
        (good.astype(np.float64), good, r"^original has dtype float64, expected float32$"),
        (good, good.astype(np.int32), r"^processed has dtype int32, expected float32$"),
        (good, good.astype(">f4"), r"^processed has dtype >f4, expected float32$"),
        (good, "not an array", r"^processed has dtype <U12, expected float32$"),
    ]
    for original, processed, message in cases:
        with pytest.raises(ValueError, match=message):
            q.merge(original, processed, real_delay=0, provenance=prov(2))
        assert state(q) == before
    big = tagged(0, 13, DIM)
    capacity_message = (
        r"^chunk has 13 rows, expected at most capacity=12$"
        if rtc
        else r"^merge would hold 20 rows \(7 queued \+ 13 incoming\), expected at most capacity=12$"
    )
    with pytest.raises(QueueError, match=capacity_message):
        q.merge(big, big, real_delay=5)
    assert state(q) == before
    stats = q.statistics()
    assert stats.rejected_merges == len(cases) + 1
    assert stats.merges == 1


def test_append_capacity_counts_only_unconsumed_rows(make: Make) -> None:
    q = make(1, rtc=False, capacity=10)
    q.merge(tagged(0, 10), tagged(0, 10), real_delay=0)
    with pytest.raises(QueueError):
        q.merge(tagged(10, 1), tagged(10, 1), real_delay=0)
    q.get()
    q.merge(tagged(10, 1), tagged(10, 1), real_delay=0)
    assert q.qsize() == 10


def test_queue_error_is_a_value_error() -> None:
    assert issubclass(QueueError, ValueError)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"action_dim": 0, "rtc": True}, "action_dim is 0"),
        ({"action_dim": 3, "rtc": True, "capacity": 0}, "capacity is 0"),
        ({"action_dim": 3, "rtc": False, "capacity": 2**32}, "capacity is 4294967296"),
    ],
)
def test_constructor_validates(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ActionQueue(**kwargs)  # type: ignore[arg-type]


def test_read_only_attributes(queue_rtc: ActionQueue) -> None:
    with pytest.raises(AttributeError):
        queue_rtc.rtc = False  # type: ignore[misc]
    assert repr(queue_rtc) == "ActionQueue(action_dim=6, rtc=True, capacity=4096, qsize=0)"


def test_statistics_snapshot(queue_rtc: ActionQueue, sample_actions: Actions) -> None:
    queue_rtc.merge(sample_actions["short"], sample_actions["short"], real_delay=0)
    queue_rtc.get()
    stats = queue_rtc.statistics()
    assert isinstance(stats, QueueStats)
    queue_rtc.get()
    assert (stats.merges, stats.rejected_merges, stats.delay_mismatches) == (1, 0, 0)
    assert (stats.actions_consumed, stats.qsize, stats.action_index) == (1, 9, 1)
    assert queue_rtc.statistics().actions_consumed == 2
    assert stats != queue_rtc.statistics()
    assert "actions_consumed=1" in repr(stats)
    with pytest.raises(AttributeError):
        stats.merges = 3  # type: ignore[misc]


def test_clear(queue_append: ActionQueue, sample_actions: Actions) -> None:
    queue_append.merge(sample_actions["short"], sample_actions["short"], 0, provenance=prov(1))
    queue_append.get()
    queue_append.clear()
    assert queue_append.qsize() == 0
    assert queue_append.get_action_index() == 0
    assert queue_append.get_left_over() is None
    assert queue_append.get_processed_left_over() is None
    assert queue_append.get() is None
    queue_append.merge(sample_actions["short"], sample_actions["short"], 0)
    np.testing.assert_array_equal(queue_append.get(), sample_actions["short"][0])


# ------------------------------------------------------------------ servo: concurrency


def test_producer_and_full_speed_consumer_append(fast_switching: None, make: Make) -> None:
    """Append mode: every action (tagged with a unique value) is seen exactly once, in order,
    and the index only goes back when a merge happened in between."""
    chunks = [tagged(sum(1 + k % 7 for k in range(i)), 1 + i % 7) for i in range(300)]
    total = sum(len(c) for c in chunks)
    q = make(1, rtc=False, capacity=total)
    started = [0]
    finished = [0]
    go = threading.Barrier(2)

    def producer() -> None:
        go.wait()
        for seq, chunk in enumerate(chunks):
            started[0] += 1
            q.merge(chunk, chunk, real_delay=2, idx_before=0, provenance=prov(seq))
            finished[0] += 1

    thread = threading.Thread(target=producer)
    thread.start()
    go.wait()
    seen: list[int] = []
    seqs: list[int] = []
    last_index, last_finished = 0, 0
    while True:
        # A merge that resets the index between two reads was started before the later read
        # and had not finished before the earlier one.
        finished_before = finished[0]
        index = q.get_action_index()
        started_after = started[0]
        if index < last_index:
            assert started_after > last_finished
        last_index, last_finished = index, finished_before
        item = q.get_with_provenance()
        if item is None:
            if finished_before == len(chunks):
                break
            continue
        action, p = item
        assert p is not None
        seen.append(int(action[0]))
        seqs.append(p.seq_id)
    thread.join()
    assert seen == list(range(total))
    assert seqs == sorted(seqs)
    assert q.statistics().actions_consumed == total


def test_merge_releases_the_gil(make: Make) -> None:
    """Another Python thread runs *inside* merge calls of a big chunk.

    ``calling`` is set right before call k; the merge counter only reaches k near the end of
    the call, after the copy. Seeing ``merges < calling`` therefore means the spinner ran
    while call k was in progress. Were the GIL held, the main thread could only switch
    threads at bytecode boundaries outside the call, where ``merges == calling``.
    """
    big = np.ones((250_000, 8), np.float32)
    q = make(8, rtc=True, capacity=len(big))
    calling = [0]
    inside = [0]
    running = threading.Event()
    stop = threading.Event()

    def spin() -> None:
        running.set()
        while not stop.is_set():
            k = calling[0]
            if q.statistics().merges < k:
                inside[0] += 1

    thread = threading.Thread(target=spin)
    thread.start()
    running.wait()
    try:
        for k in range(1, 11):
            calling[0] = k
            q.merge(big, big, real_delay=0)
    finally:
        stop.set()
        thread.join()
    assert inside[0] > 0


# ------------------------------------------------------------------ servo: leaks


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
@pytest.mark.parametrize("rtc", [True, False])
def test_merge_get_cycles_keep_rss_bounded(rtc: bool, make: Make) -> None:
    q = make(32, rtc=rtc)
    chunk = np.ones((50, 32), np.float32)

    def cycles(n: int) -> None:
        for i in range(n):
            q.merge(chunk, chunk, 3, q.get_action_index(), provenance=prov(i))
            for _ in range(50 if not rtc else 1):
                q.get()
            q.get_with_provenance()
            q.get_left_over()
            q.statistics()

    cycles(1_000)
    before = rss_bytes()
    cycles(10_000)
    growth = rss_bytes() - before
    assert growth < 16 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB over 10^4 cycles"
