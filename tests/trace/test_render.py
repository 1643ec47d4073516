"""The trace's verdict: where the longest stretch without a fresh action came from."""

from __future__ import annotations

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
