"""The trace's verdict: where the longest stretch without a fresh action came from."""

from __future__ import annotations

from datetime import datetime

import numpy as np

from servo.trace import Request, Timeline
from servo.trace.render import summary

MS = 1_000_000


def timeline(staleness_ms: float, held_ticks: int) -> Timeline:
    t = Timeline("robot-7", 0, 10_000 * MS, fps=30.0, joint_names=["a"])
    action = np.zeros(1, np.float32)
    at = 0
    for i in range(60):
        source = "fallback" if 20 <= i < 20 + held_ticks else "policy"
        t.ticks.append((at, source, None if source == "fallback" else action))
        at += 33 * MS
    audit = {"staleness_ms": staleness_ms, "_wall_ns": 600 * MS, "outcome": "ok", "replica": "r0"}
    t.requests = [Request("ab" * 16, 4, sent_ns=500 * MS, first_ns=540 * MS, actions=6, audit=audit)]
    return t


def test_a_slow_replica_is_named() -> None:
    assert "look at the replica" in summary(timeline(staleness_ms=900.0, held_ticks=15))[-1]


def test_a_quick_replica_points_at_the_link_or_the_edge() -> None:
    verdict = summary(timeline(staleness_ms=4.0, held_ticks=15))[-1]
    assert "15 tick(s)" in verdict
    assert "look at the link or the edge" in verdict


def test_no_stutter_no_verdict() -> None:
    assert summary(timeline(staleness_ms=4.0, held_ticks=0))[-1] == "no tick went without a fresh action"


def test_a_stretch_cut_by_the_window_says_so_and_the_recordings_say_what_they_cover() -> None:
    t = timeline(staleness_ms=4.0, held_ticks=0)
    # The window opens while the robot already holds: its first 10 ticks, and the tick before it.
    t.ticks = [(at, "fallback" if i < 10 else "policy", action) for i, (at, _, action) in enumerate(t.ticks)]
    t.covers = [(-500 * MS, 10_000 * MS, "ep1.servo")]
    t.held_before = True
    verdict = summary(t)[-1]
    assert "10 tick(s) from" in verdict
    assert "at least: it began before the window: start --at earlier" in verdict
    assert not any("not recorded whole" in line for line in summary(t))
    # ... and one that is still holding when the window ends.
    t.ticks = [(at, "policy" if i < 50 else "fallback", action) for i, (at, _, action) in enumerate(t.ticks)]
    t.held_before, t.held_after = False, True
    assert "goes on past the window's end: a longer --window sees all of it" in summary(t)[-1]
    # A window the recordings cover only in part says which times they do cover.
    t.covers = [(2_000 * MS, 60 * 33 * MS, "ep2.servo")]
    partly = [line for line in summary(t) if "not recorded whole" in line]
    assert partly == [
        f"the window is not recorded whole: its recordings cover {part(2_000)} to {part(1_980)} (ep2.servo)"
    ]


def part(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1e3).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
