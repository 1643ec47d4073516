"""servo._core.LatencyTracker: sliding-window max and nearest-rank percentiles."""

from __future__ import annotations

import math
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servo._core import LatencyTracker


def nearest_rank(samples: list[int], q: float) -> int:
    ordered = sorted(samples)
    return ordered[max(math.ceil(q * len(ordered)), 1) - 1]


def test_empty() -> None:
    t = LatencyTracker()
    assert t.window == 100
    assert t.max() is None
    assert t.percentile(0.5) is None
    assert t.percentiles([0.5, 0.99]) is None
    assert t.count() == 0


def test_sliding_max_forgets_samples_that_left_the_window() -> None:
    t = LatencyTracker(window=3)
    for ns in (10, 50, 20):
        t.add(ns)
    assert t.max() == 50
    t.add(5)
    assert t.max() == 50
    t.add(6)
    assert t.max() == 20
    t.add(7)
    assert t.max() == 7
    assert t.count() == 3


def test_nearest_rank_percentiles() -> None:
    t = LatencyTracker(window=10)
    for ns in range(100, 0, -10):  # 100, 90, ..., 10
        t.add(ns)
    assert t.percentile(0.0) == 10
    assert t.percentile(0.1) == 10
    assert t.percentile(0.11) == 20
    assert t.percentile(0.5) == 50
    assert t.percentile(0.99) == 100
    assert t.percentile(1.0) == 100
    assert t.percentiles([0.5, 0.9, 0.0]) == [50, 90, 10]
    assert t.percentiles([]) == []
    assert t.percentiles((0.5,)) == [50]


def test_reset() -> None:
    t = LatencyTracker(window=4)
    t.add(5)
    t.reset()
    assert (t.count(), t.max(), t.percentile(1.0)) == (0, None, None)
    t.add(3)
    assert t.max() == 3


@pytest.mark.parametrize("q", [-0.01, 1.01, math.nan, math.inf])
def test_quantile_out_of_range(q: float) -> None:
    t = LatencyTracker()
    t.add(1)
    with pytest.raises(ValueError, match="expected 0 <= q <= 1"):
        t.percentile(q)
    with pytest.raises(ValueError, match="expected 0 <= q <= 1"):
        t.percentiles([0.5, q])


def test_negative_sample_and_bad_window() -> None:
    t = LatencyTracker(window=2)
    with pytest.raises(ValueError, match="-1 ns"):
        t.add(-1)
    assert t.count() == 0
    for window in (0, -5):
        with pytest.raises(ValueError, match="window"):
            LatencyTracker(window=window)


def test_large_samples_are_exact() -> None:
    t = LatencyTracker(window=2)
    t.add(2**63 - 1)
    t.add(2**62)
    assert t.max() == 2**63 - 1
    assert t.percentile(0.5) == 2**62


@given(
    window=st.integers(1, 20),
    samples=st.lists(st.integers(0, 10**12), min_size=1, max_size=120),
    q=st.floats(0.0, 1.0),
)
def test_matches_brute_force(window: int, samples: list[int], q: float) -> None:
    t = LatencyTracker(window=window)
    for i, ns in enumerate(samples):
        t.add(ns)
        live = samples[max(0, i + 1 - window) : i + 1]
        assert t.max() == max(live)
        assert t.count() == len(live)
    assert t.percentile(q) == nearest_rank(live, q)
    assert t.percentiles([q, 1.0, 0.0]) == [nearest_rank(live, q), max(live), min(live)]


def test_thread_safety_smoke() -> None:
    t = LatencyTracker(window=64)
    go = threading.Barrier(4)
    errors: list[BaseException] = []

    def writer(base: int) -> None:
        go.wait()
        for i in range(2_000):
            t.add(base + i)

    def reader() -> None:
        go.wait()
        try:
            for _ in range(500):
                values = t.percentiles([0.0, 0.5, 1.0])
                if values is not None:
                    low, mid, high = values
                    assert low <= mid <= high
                    top = t.max()
                    assert top is not None
                assert 0 <= t.count() <= 64
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(b,)) for b in (0, 10**6)]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert t.count() == 64
    # The very last sample is one writer's final value, base + 1999: it is in the window.
    top = t.max()
    assert top is not None
    assert top >= 1_999
    assert top == t.percentile(1.0)
