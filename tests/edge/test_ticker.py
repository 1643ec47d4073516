"""DeadlineSleeper: sleep to just before a deadline, spin the rest, the lead following the wake-ups."""

from __future__ import annotations

import time

import pytest

from servo.edge.ticker import LEAD_MAX_NS, LEAD_MIN_NS, LEAD_SLACK_NS, DeadlineSleeper

PERIOD_NS = 33_333_333


class SlowWakingCore:
    """A clock whose sleeps wake ``late_ns`` after they should (an idle vCPU), and that spinning advances."""

    def __init__(self, late_ns: int) -> None:
        self.now = 0
        self.late_ns = late_ns
        self.sleeps: list[float] = []

    def clock(self) -> int:
        self.now += 1_000  # every read of the clock costs a microsecond of spinning
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += round(seconds * 1e9) + self.late_ns


def run(core: SlowWakingCore, ticks: int) -> list[int]:
    """Wait for ``ticks`` deadlines one period apart; returns how late each wait returned."""
    sleeper = DeadlineSleeper(PERIOD_NS, clock=core.clock, sleep=core.sleep)
    lateness = []
    for k in range(1, ticks + 1):
        deadline = k * PERIOD_NS
        sleeper.wait(deadline)
        lateness.append(core.now - deadline)
    return lateness


def test_a_slow_waking_core_is_on_time_once_the_lead_covers_its_wake_ups() -> None:
    core = SlowWakingCore(late_ns=3_000_000)  # 3 ms, as an idle vCPU
    lateness = run(core, 20)
    assert lateness[0] > 2_000_000  # the first sleep learns it
    assert all(0 <= late <= 2_000 for late in lateness[1:])  # then on time, to the clock's step


def test_the_lead_follows_the_wake_ups_within_its_bounds() -> None:
    core = SlowWakingCore(late_ns=0)
    sleeper = DeadlineSleeper(PERIOD_NS, clock=core.clock, sleep=core.sleep)
    sleeper.wait(PERIOD_NS)
    assert sleeper.lead_ns == LEAD_MIN_NS  # an awake core: the floor
    core.late_ns = 1_000_000
    sleeper.wait(2 * PERIOD_NS)
    assert sleeper.lead_ns == pytest.approx(1_000_000 + LEAD_SLACK_NS, abs=5_000)
    core.late_ns = 50_000_000
    sleeper.wait(3 * PERIOD_NS)
    assert sleeper.lead_ns == LEAD_MAX_NS  # capped: never spins most of a period


def test_the_lead_is_at_most_half_a_short_period() -> None:
    core = SlowWakingCore(late_ns=8_000_000)
    sleeper = DeadlineSleeper(4_000_000, clock=core.clock, sleep=core.sleep)  # 250 Hz
    for k in range(1, 4):
        sleeper.wait(k * 4_000_000)
    assert sleeper.lead_ns == 2_000_000


def test_a_deadline_already_passed_returns_without_sleeping() -> None:
    core = SlowWakingCore(late_ns=0)
    core.now = 10 * PERIOD_NS
    sleeper = DeadlineSleeper(PERIOD_NS, clock=core.clock, sleep=core.sleep)
    sleeper.wait(PERIOD_NS)
    assert core.sleeps == []


def test_on_the_real_clock_it_never_returns_early() -> None:
    sleeper = DeadlineSleeper(10_000_000)
    for _ in range(20):
        deadline = time.monotonic_ns() + 2_000_000
        sleeper.wait(deadline)
        assert time.monotonic_ns() >= deadline
    assert sleeper.spun_ns > 0


def test_without_spin_it_sleeps_to_the_deadline_and_wakes_as_late_as_the_core() -> None:
    core = SlowWakingCore(late_ns=3_000_000)
    sleeper = DeadlineSleeper(PERIOD_NS, spin=False, clock=core.clock, sleep=core.sleep)
    sleeper.wait(PERIOD_NS)
    sleeper.wait(2 * PERIOD_NS)
    assert sleeper.lead_ns == 0
    assert core.now - 2 * PERIOD_NS >= 3_000_000  # the plain sleep's lateness, every time
