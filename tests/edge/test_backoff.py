"""Backoff: the one retry schedule of the remote engine (first connect, first session, reconnects)."""

from __future__ import annotations

import time

import anyio
import pytest

from servo.edge.backoff import Backoff


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_delays_grow_by_the_factor_up_to_the_maximum_and_reset() -> None:
    backoff = Backoff(0.5, 3.0, factor=2.0)
    assert [backoff.next_delay() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff.delay == 3.0  # what the next wait will be (logged as retry_in_s)
    backoff.reset()
    assert backoff.next_delay() == 0.5


def test_no_wait_that_would_end_past_the_deadline() -> None:
    clock = FakeClock()
    backoff = Backoff(1.0, 10.0, deadline_s=4.0, clock=clock)
    assert backoff.next_delay() == 1.0
    clock.now += 1.0
    assert backoff.next_delay() == 2.0
    clock.now += 2.0
    # 3 s elapsed; the next delay (4 s) would end at 7 s > 4 s: give up now, not after sleeping.
    assert backoff.next_delay() is None
    assert backoff.next_delay() is None


@pytest.mark.anyio
async def test_wait_sleeps_the_delay_or_returns_false_without_sleeping() -> None:
    clock = FakeClock()
    backoff = Backoff(0.02, 0.02, deadline_s=0.05, clock=clock)
    started = time.monotonic()
    assert await backoff.wait()
    # An event loop may run a timer up to its clock's resolution early (19.8 ms seen for 20 ms).
    assert time.monotonic() - started >= 0.02 - 0.002
    clock.now += 0.04
    # Past the deadline: False without a checkpoint (an expired scope would otherwise cancel it).
    with anyio.move_on_after(0) as scope:
        assert not await backoff.wait()
    assert not scope.cancelled_caught
