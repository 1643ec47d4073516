"""The capacity plan: docs/design/capacity.md from a measured forward time, and the warnings a user needs."""

from __future__ import annotations

import re

import pytest

from servo.deploy.capacity import CapacityPlan, ForwardTiming
from servo.wire import Tuning


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
    assert float(match.group(1)) == p.edge_buffer_s
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
    assert "forward 12 ms (measured on cuda)" in first
    assert "chunk 20 steps = 667 ms at 30 fps" in first
    assert "asks every 167 ms" in first
    assert "within 500 ms" in first
    assert "carries 11 robot(s)" in capacity
    assert "docs/design/capacity.md" in capacity
    assert "network round trip assumed" in capacity


def test_the_forward_is_the_median_of_the_timed_requests_with_p90_and_load() -> None:
    """One fast forward among slow ones (the old plan's pick: the fastest of two) moves nothing."""
    durations = [0.040] + [0.100] * 8 + [0.180]
    timing = ForwardTiming.measure(durations)
    assert timing is not None
    assert (timing.median_s, timing.p90_s, timing.count) == (0.100, 0.100, 10)
    assert ForwardTiming.measure([0.1] * 9 + [0.5]) == ForwardTiming(0.1, 0.1, 10, timing.load, timing.cores)
    assert ForwardTiming.measure([]) is None
    quiet = ForwardTiming(0.0847, 0.0952, 10, 0.4, 2)
    first = plan(quiet.median_s, 50).describe(device="cpu", max_sessions=8, timing=quiet)[0]
    assert first.startswith("forward 84.7 ms median, p90 95.2 ms (10 timed after warm-up on cpu; load 0.4 on 2 cores)")
    busy = ForwardTiming(0.0847, 0.0952, 10, 9.5, 2)
    assert "load 9.5 on 2 cores, a busy machine: time it again when quiet" in busy.describe("cpu")


def test_the_fixes_are_named_as_the_policys_own_options() -> None:
    """A Diffusion policy: its chunk is n_action_steps, capped by its horizon; its cost is its steps."""
    diffusion = Tuning(
        chunk="n_action_steps",
        chunk_max=15,
        chunk_max_why="horizon 16 - n_obs_steps 2 + 1; a longer horizon means retraining",
        faster=["num_inference_steps (100 now)"],
    )
    p = CapacityPlan(2.5, 8, 10.0, rtc=False, buffer_s=0.5, tuning=diffusion)
    warning = p.warning()
    assert warning is not None
    assert f"n_action_steps >= {p.needed_steps}; at most 15 here: horizon 16 - n_obs_steps 2 + 1" in warning
    assert "lower num_inference_steps (100 now)" in warning
    assert "chunk_size" not in warning
    assert p.needed_steps == 32  # a 2.5 s forward is at most 80 % of 3.2 s at 10 fps, and one more step
    assert CapacityPlan(2.5, p.needed_steps, 10.0, rtc=False, buffer_s=3.0).robots >= 1


def test_the_buffer_the_plan_asks_for_only_when_it_helps() -> None:
    assert plan(0.6, 50).edge_buffer_s == 0.65
    assert plan(0.02, 50).edge_buffer_s is None  # the default buffer does
    assert plan(2.0, 50).edge_buffer_s is None  # a forward longer than the chunk: no buffer can


def test_one_robot_that_keeps_the_replica_busy_is_told_to_lengthen_the_chunk_not_the_buffer() -> None:
    # 20 steps at 30 fps with RTC and a 0.5 s buffer: a robot asks every 212 ms; a 202 ms forward
    # is 95 % of that (the capacity formula allows 80 %), though it is well within the buffer.
    p = plan(0.202, 20)
    assert p.robots == 0
    assert p.edge_buffer_s is None  # a longer buffer would make it ask more often, not less
    warning = p.warning()
    assert warning is not None
    assert "takes more than 80% of the 212 ms between one robot's requests" in warning
    assert f"chunk_size >= {p.needed_steps}" in warning
    assert plan(0.202, p.needed_steps).robots >= 1
    assert plan(0.202, p.needed_steps - 1).robots == 0
