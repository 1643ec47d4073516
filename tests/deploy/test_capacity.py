"""The capacity plan: docs/design/capacity.md from a measured forward time, and the warnings a user needs."""

from __future__ import annotations

import re

import pytest

from servo.deploy.capacity import CapacityPlan, measured_forward_s


def plan(
    forward_s: float, chunk_size: int, fps: float = 30.0, *, rtc: bool = True, buffer_s: float = 0.5
) -> CapacityPlan:
    return CapacityPlan(forward_s, chunk_size, fps, rtc=rtc, buffer_s=buffer_s)


@pytest.mark.parametrize(
    ("forward_s", "robots"),
    [(0.020, 40), (0.150, 5)],  # docs/design/capacity.md §1: ACT at 20 ms ~40 robots, Pi0 at 150 ms ~5
)
def test_the_seed_examples_at_one_request_per_second(forward_s: float, robots: int) -> None:
    # 60 steps at 30 fps = 2 s; RTC with a 1 s buffer: each robot asks once a second.
    p = plan(forward_s, 60, buffer_s=1.0)
    assert p.executed_s == pytest.approx(1.0)
    assert p.robots == robots
    assert p.warning() is None


def test_appended_chunks_are_executed_whole() -> None:
    rtc, append = plan(0.02, 60), plan(0.02, 60, rtc=False)
    assert rtc.executed_s == pytest.approx(1.5)
    assert append.executed_s == pytest.approx(2.0)
    assert append.robots >= rtc.robots


def test_the_latency_bound_caps_a_fast_model() -> None:
    # Utilisation alone would allow 0.8 * 2.83 / 0.012 = 188; every robot asking at once must be
    # served within the 0.5 s it still holds: (0.5 - 0.02) / 0.012 = 40.
    assert plan(0.012, 100).robots == 40


def test_a_forward_longer_than_a_chunk_warns_with_the_fixes() -> None:
    # The observed case: ACT, ResNet18, two 480x640 cameras on a CPU against a 10-step chunk at 30 fps.
    p = plan(0.928, 10, rtc=False)
    assert p.robots == 0
    warning = p.warning()
    assert warning is not None
    assert "928 ms" in warning
    assert "333 ms" in warning
    for fix in ("GPU", "cameras", "smaller model", "longer chunk"):
        assert fix in warning
    lines = p.describe(device="cpu", max_sessions=8)
    assert lines[-1] == warning
    assert len(lines) == 3


def test_a_forward_longer_than_the_edge_buffer_names_a_buffer_that_works() -> None:
    p = plan(0.6, 50)
    assert p.robots == 0
    warning = p.warning()
    assert warning is not None
    match = re.search(r"--buffer-time-s (\d+(?:\.\d+)?)", warning)
    assert match is not None
    assert plan(0.6, 50, buffer_s=float(match.group(1))).robots >= 1


def test_more_sessions_admitted_than_carried_is_pointed_out() -> None:
    p = plan(0.15, 50)
    assert p.robots == 3
    assert (
        "serving.max_sessions = 8 admits more: set it to 3 (--max-sessions 3)"
        in p.describe(device="cuda", max_sessions=8)[1]
    )
    assert "max_sessions" not in p.describe(device="cuda", max_sessions=3)[1]


def test_the_plan_says_what_it_measured_and_assumed() -> None:
    first, capacity = plan(0.012, 20).describe(device="cuda", max_sessions=8)
    assert "forward 12 ms (measured at warm-up on cuda)" in first
    assert "chunk 20 steps = 667 ms at 30 fps" in first
    assert "asks every 167 ms" in first
    assert "within 500 ms" in first
    assert "carries 11 robot(s)" in capacity
    assert "docs/design/capacity.md" in capacity
    assert "network round trip assumed" in capacity


def test_the_first_warm_up_forward_is_left_out_when_there_are_more() -> None:
    assert measured_forward_s([2.5, 0.03, 0.02]) == 0.02
    assert measured_forward_s([0.4]) == 0.4
    assert measured_forward_s([]) is None
