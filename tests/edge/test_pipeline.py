"""ChunkPipeline: the request/merge discipline, the staleness bound and the fallback ladder."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from servo._core import ActionQueue, QueueError
from servo.edge.actions import ActionFeed, ControlConfig, Fallback
from servo.edge.observation import ObservationInput
from servo.edge.pipeline import ChunkPipeline, PipelineConfig, Request
from servo.wire import Tuning

FPS = 10.0
DT_NS = round(1e9 / FPS)
DIM = 3


def make_pipeline(
    *,
    rtc: bool = True,
    fallback: Fallback = "hold",
    max_age_s: float = 3.0,
    horizon: int = 4,
) -> ChunkPipeline:
    return ChunkPipeline(
        DIM,
        FPS,
        PipelineConfig(rtc=rtc, execution_horizon=horizon, buffer_time_s=0.5),
        ControlConfig(max_action_age_s=max_age_s, fallback=fallback),
    )


def sid(n: int) -> str:
    """A session id (32 hex characters)."""
    return f"{n:032x}"


def observe(pipe: ChunkPipeline, mono_ns: int) -> ObservationInput:
    """An observation taken now, at tick ``mono_ns // DT_NS``, stamped with the queue's position."""
    return ObservationInput(np.zeros(DIM, np.float32), {}, mono_ns, mono_ns // DT_NS, pipe.queue.get_position())


def ask(pipe: ChunkPipeline, mono_ns: int) -> Request:
    """A request for an observation taken now."""
    return pipe.snapshot(observe(pipe, mono_ns))


def chunk(length: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """Model-space rows ``base + i`` and robot-space rows ``base + i + 0.5`` (distinguishable)."""
    rows = (base + np.arange(length, dtype=np.float32))[:, None].repeat(DIM, axis=1)
    return rows, rows + np.float32(0.5)


def round_trip(pipe: ChunkPipeline, latency_ms: float, seq: int) -> int:
    """One request answered after ``latency_ms``; returns the delay estimate the request carried."""
    start = seq * 10 * DT_NS
    request = ask(pipe, start)
    model, robot = chunk(10, float(seq))
    pipe.complete(request, model, robot, start + round(latency_ms * 1e6), session_id=sid(1), seq_id=seq)
    return request.delay_steps


def test_snapshot_delay_is_the_median_of_recent_round_trips() -> None:
    pipe = make_pipeline()
    request = ask(pipe, 0)
    assert request.delay_steps == 0 == pipe.last_delay_steps  # no sample yet
    assert request.episode_id == 0
    assert request.prefix_model is None
    assert request.prefix_robot is None
    for seq, ms in enumerate((50, 210, 120), 1):
        round_trip(pipe, ms, seq)
    # The median (120 ms) rules, not the worst: ceil(1.2) = 2 steps at 10 fps.
    assert ask(pipe, 0).delay_steps == 2 == pipe.last_delay_steps


@pytest.mark.parametrize(("outliers", "wrong"), [(1, 0), (2, 0), (3, 3)])
def test_delay_estimate_is_back_to_the_true_delay_within_five_requests_after_an_outlier(
    outliers: int, wrong: int
) -> None:
    pipe = make_pipeline()
    seq = 0
    for _ in range(8):  # steady state: 250 ms = 3 steps at 10 fps
        seq += 1
        round_trip(pipe, 250, seq)
    for _ in range(outliers):  # chunks 4 s late (a hung server)
        seq += 1
        round_trip(pipe, 4000, seq)
    carried = []
    for _ in range(5):
        seq += 1
        carried.append(round_trip(pipe, 250, seq))
    # One or two late chunks never move the estimate; three hold it for three requests.
    assert carried == [40] * wrong + [3] * (5 - wrong)
    assert pipe.latency.max() == 4000 * 1_000_000  # the run summary still sees the outlier


def test_snapshot_ships_the_plan_from_the_observation_on_capped_by_the_horizon() -> None:
    pipe = make_pipeline(horizon=4)
    model, robot = chunk(10, 0.0)
    pipe.complete(ask(pipe, 0), model, robot, 0, session_id=sid(1), seq_id=1)
    for _ in range(2):
        assert pipe.next_action(0) is not None
    observed = observe(pipe, 0)
    assert pipe.next_action(0) is not None  # the engine gets to the observation a tick later
    request = pipe.snapshot(observed)
    # The chunk's row 0 is meant for the observation's tick: its prefix starts there too.
    assert request.prefix_model is not None
    assert request.prefix_robot is not None
    np.testing.assert_array_equal(request.prefix_model, model[2:6])
    np.testing.assert_array_equal(request.prefix_robot, robot[2:6])


def test_complete_trims_exactly_the_actions_taken_since_the_observation() -> None:
    pipe = make_pipeline()
    sent_ns = 1_000 * DT_NS
    first = ask(pipe, sent_ns - DT_NS)
    pipe.complete(first, *chunk(20, 0.0), sent_ns, session_id=sid(7), seq_id=1)
    request = ask(pipe, sent_ns)
    for _ in range(3):  # three ticks execute while the request is in flight
        pipe.next_action(sent_ns)
    model, robot = chunk(20, 100.0)
    arrived = sent_ns + 3 * DT_NS - DT_NS // 2  # 2.5 periods -> real_delay 3
    trimmed = pipe.complete(request, model, robot, arrived, session_id=sid(7), seq_id=2)

    assert pipe.last_real_delay == math.ceil(2.5) == 3
    assert trimmed == 3
    assert pipe.latency.max() == 3 * DT_NS - DT_NS // 2
    action = pipe.next_action(arrived)
    assert action is not None
    assert action.source == "policy"
    np.testing.assert_array_equal(action.values, robot[3])  # robot space, first untrimmed step
    assert action.provenance is not None
    # Row 3 of the chunk of the observation at tick 1000: meant for step 1003.
    assert tuple(action.provenance) == (sid(7), 2, 0, sent_ns, 1003)


def test_a_chunk_merged_late_skips_every_action_taken_whatever_the_latency_says() -> None:
    pipe = make_pipeline()
    pipe.complete(ask(pipe, 0), *chunk(20, 0.0), 0, session_id=sid(1), seq_id=1)
    observed = observe(pipe, 10 * DT_NS)
    for _ in range(4):  # four ticks take an action; the latency below says only two steps passed
        assert pipe.next_action(0) is not None
    trimmed = pipe.complete(pipe.snapshot(observed), *chunk(20, 100.0), 12 * DT_NS, session_id=sid(1), seq_id=2)
    assert (pipe.last_real_delay, trimmed) == (2, 4)  # LeRobot's min(2, 4) would run steps 12 and 13 twice
    action = pipe.next_action(0)
    assert action is not None
    assert action.provenance is not None
    assert action.provenance.step == 14


def test_an_observation_from_before_the_last_merge_is_not_current() -> None:
    pipe = make_pipeline()
    observed = observe(pipe, 0)
    assert pipe.current(observed)
    pipe.complete(pipe.snapshot(observed), *chunk(5, 0.0), 0, session_id=sid(1), seq_id=1)
    assert not pipe.current(observed)
    with pytest.raises(QueueError, match="was read before the last merge"):
        pipe.snapshot(observed)


def test_complete_never_trims_more_than_was_consumed() -> None:
    # The latency says 3 steps passed, but only one action was executed (the queue ran dry):
    # trimming 3 would skip actions the robot never ran, a jump on a real arm.
    pipe = make_pipeline()
    pipe.complete(ask(pipe, 0), *chunk(1, 0.0), 0, session_id=sid(1), seq_id=1)
    request = ask(pipe, 0)
    pipe.next_action(0)
    pipe.next_action(0)  # starved
    trimmed = pipe.complete(request, *chunk(10, 50.0), 3 * DT_NS, session_id=sid(1), seq_id=2)
    assert pipe.last_real_delay == 3
    assert trimmed == 1


def test_append_mode_keeps_the_queue_and_continues_after_it() -> None:
    pipe = make_pipeline(rtc=False)
    pipe.complete(ask(pipe, 0), *chunk(4, 0.0), 0, session_id=sid(1), seq_id=1)
    request = ask(pipe, 0)
    assert pipe.next_action(0) is not None
    # Steps 0-3 were taken or are queued: the new chunk goes on from its row 4.
    assert pipe.complete(request, *chunk(8, 10.0), 5 * DT_NS, session_id=sid(1), seq_id=2) == 4
    got = [pipe.next_action(0) for _ in range(8)]
    assert [float(a.values[0]) for a in got if a is not None] == [1.5, 2.5, 3.5, 14.5, 15.5, 16.5, 17.5]


def test_episode_reset_drops_a_late_chunk() -> None:
    pipe = make_pipeline()
    pipe.complete(ask(pipe, 0), *chunk(10, 0.0), 0, session_id=sid(1), seq_id=1)
    request = ask(pipe, 0)  # episode 0 request in flight ...
    assert pipe.reset_episode() == 1  # ... when the episode ends
    assert pipe.queue.empty()
    assert pipe.complete(request, *chunk(10, 5.0), DT_NS, session_id=sid(1), seq_id=2) is None
    assert pipe.queue.empty()
    fresh = ask(pipe, 0)
    assert fresh.episode_id == 1
    assert pipe.complete(fresh, *chunk(10, 9.0), DT_NS, session_id=sid(1), seq_id=3) is not None
    action = pipe.next_action(DT_NS)
    assert action is not None
    assert action.provenance is not None
    assert action.provenance.episode_id == 1


def test_staleness_bound_refuses_an_old_action_and_clears_the_rest() -> None:
    pipe = make_pipeline(max_age_s=1.0, fallback="zero")
    obs_ns = 5 * DT_NS
    pipe.complete(ask(pipe, obs_ns), *chunk(30, 0.0), obs_ns, session_id=sid(1), seq_id=1)
    ok = pipe.next_action(obs_ns + 1_000_000_000)  # exactly max age: still allowed
    assert ok is not None
    assert ok.source == "policy"

    late = obs_ns + 1_000_000_001
    action = pipe.next_action(late)
    assert action is not None
    assert action.source == "fallback"
    assert action.provenance is None
    assert pipe.stale_refusals == 1
    assert pipe.fallback_ticks == 1
    assert pipe.last_starved_ns == late
    assert pipe.queue.empty()  # the rest of that chunk is at least as old
    assert pipe.needs_observation()


@pytest.mark.parametrize(
    ("fallback", "expected"),
    [("hold", None), ("repeat_last", [1.5, 1.5, 1.5]), ("zero", [0.0, 0.0, 0.0])],
)
def test_fallback_ladder(fallback: Fallback, expected: list[float] | None) -> None:
    pipe = make_pipeline(fallback=fallback)
    first = pipe.next_action(0)  # nothing queued and nothing executed yet
    assert first is None if fallback != "zero" else first is not None
    pipe.complete(ask(pipe, 0), *chunk(2, 0.0), 0, session_id=sid(1), seq_id=1)
    assert pipe.next_action(0) is not None
    assert pipe.next_action(0) is not None  # last policy action: robot row 1 = 1.5
    starved = pipe.next_action(DT_NS)
    if expected is None:
        assert starved is None
    else:
        assert starved is not None
        assert starved.source == "fallback"
        assert starved.values.tolist() == expected
    assert pipe.fallback_ticks == 2


def test_repeat_last_forgets_the_previous_episode() -> None:
    pipe = make_pipeline(fallback="repeat_last")
    pipe.complete(ask(pipe, 0), *chunk(1, 0.0), 0, session_id=sid(1), seq_id=1)
    assert pipe.next_action(0) is not None
    pipe.reset_episode()
    assert pipe.next_action(0) is None  # never replay an action of the last episode


def test_needs_observation_follows_buffer_time() -> None:
    pipe = make_pipeline()  # buffer 0.5 s at 10 fps = 5 steps
    assert pipe.needs_observation()
    pipe.complete(ask(pipe, 0), *chunk(6, 0.0), 0, session_id=sid(1), seq_id=1)
    assert not pipe.needs_observation()
    pipe.next_action(0)
    assert not pipe.needs_observation()  # 5 left
    pipe.next_action(0)
    assert pipe.needs_observation()  # 4 left < 5


class RacingQueue:
    """An ActionQueue whose pop lets a producer merge right after it (the worker racing in)."""

    def __init__(self, inner: ActionQueue, after_pop: Callable[[], None]) -> None:
        self._inner = inner
        self._after_pop = after_pop

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def get_with_provenance(self) -> Any:
        item = self._inner.get_with_provenance()
        self._after_pop()
        return item


def test_a_fresh_chunk_merged_during_a_stale_refusal_survives() -> None:
    pipe = make_pipeline(max_age_s=1.0)
    pipe.complete(ask(pipe, 0), *chunk(10, 0.0), 0, session_id=sid(1), seq_id=1)
    late = 2_000_000_000
    fresh = ask(pipe, late)
    merged = []

    def merge_fresh() -> None:
        if not merged:  # once
            merged.append(pipe.complete(fresh, *chunk(10, 50.0), late, session_id=sid(1), seq_id=2))

    feed = ActionFeed(RacingQueue(pipe.queue, merge_fresh), pipe.counters, pipe.control)  # type: ignore[arg-type]
    refused = feed.get_action(late)  # pops a stale action; the fresh chunk lands meanwhile
    assert refused is None
    assert pipe.stale_refusals == 1
    action = feed.get_action(late)
    assert action is not None
    assert action.provenance is not None
    assert action.provenance.seq_id == 2  # not wiped by the stale refusal's discard


def test_the_send_threshold_covers_the_expected_round_trip_and_a_margin() -> None:
    pipe = make_pipeline()  # buffer 0.5 s at 10 fps = 5 steps
    assert pipe.send_below() == 5  # no round trip measured yet: the buffer alone
    for seq in range(1, 4):
        round_trip(pipe, 100, seq)
    assert pipe.send_below() == 5  # a fast round trip: the buffer is the floor
    for seq in range(4, 8):
        round_trip(pipe, 700, seq)
    # 0.7 s + 25 % = 0.875 s: the request leaves while 9 steps are queued, not 5.
    assert pipe.send_below() == 9
    pipe.queue.clear()
    pipe.complete(ask(pipe, 0), *chunk(10, 0.0), 0, session_id=sid(1), seq_id=9)
    assert not pipe.needs_observation()  # 10 queued
    pipe.next_action(0)
    assert not pipe.needs_observation()  # 9 steps = 0.9 s still cover 0.875 s
    pipe.next_action(0)
    assert pipe.needs_observation()  # 8 steps = 0.8 s do not


def test_the_send_margin_is_at_least_fifty_milliseconds() -> None:
    pipe = ChunkPipeline(DIM, 100.0, PipelineConfig(execution_horizon=4, buffer_time_s=0.01), ControlConfig())
    for seq in range(1, 4):
        round_trip(pipe, 40, seq)
    assert pipe.send_below() == 9  # 40 ms + 50 ms at 100 fps


def test_the_rtc_prefix_covers_the_expected_delay_when_it_is_longer_than_the_horizon() -> None:
    pipe = make_pipeline(horizon=4)
    for seq in range(1, 4):
        round_trip(pipe, 650, seq)  # 7 steps at 10 fps
    pipe.queue.clear()
    model, robot = chunk(20, 0.0)
    pipe.complete(ask(pipe, 0), model, robot, 0, session_id=sid(1), seq_id=9)
    request = ask(pipe, 0)
    assert request.delay_steps == 7
    assert request.prefix_model is not None
    assert request.prefix_robot is not None
    np.testing.assert_array_equal(request.prefix_model, model[:7])
    np.testing.assert_array_equal(request.prefix_robot, robot[:7])


@pytest.mark.parametrize(
    ("rtc", "rtt_ms", "chunk_steps", "needed"),
    [
        (True, 700, 13, 14),  # the chunk's own round trip is dropped, so 2 x 7 steps
        (True, 700, 14, None),
        (False, 700, 13, 14),  # appended too: its steps that went by are left out
        (False, 700, 14, None),
    ],
)
def test_starvation_names_the_chunk_length_that_would_keep_the_queue_fed(
    rtc: bool, rtt_ms: float, chunk_steps: int, needed: int | None
) -> None:
    pipe = make_pipeline(rtc=rtc)
    assert pipe.starvation(chunk_steps) is None  # nothing measured
    starvation = pipe.starvation(chunk_steps, round(rtt_ms * 1e6))
    if needed is None:
        assert starvation is None
        return
    assert starvation is not None
    assert starvation.needed_steps == needed
    assert f"chunk_size >= {needed}" in starvation.message()
    assert f"need >= {needed}" in starvation.short()


def test_starvation_advice_names_the_policys_own_options() -> None:
    """A Diffusion policy's chunk is n_action_steps, bounded by its horizon; its speed is its steps."""
    starvation = make_pipeline(rtc=False).starvation(8, round(2_000 * 1e6))
    assert starvation is not None
    diffusion = Tuning(
        chunk="n_action_steps",
        chunk_max=15,
        chunk_max_why="horizon 16 - n_obs_steps 2 + 1; a longer horizon means retraining",
        faster=["num_inference_steps (100 now)"],
    )
    message = starvation.message(diffusion)
    assert f"n_action_steps >= {starvation.needed_steps}; at most 15 here: horizon 16 - n_obs_steps 2 + 1" in message
    assert "lower num_inference_steps (100 now)" in message
    assert "chunk_size" not in message


def test_starvation_waits_for_three_round_trips_before_judging() -> None:
    pipe = make_pipeline()
    for seq in range(1, 3):
        round_trip(pipe, 900, seq)  # a slow start: a chunk of 10 steps (1 s) would need 18
        assert pipe.starvation(10) is None
    round_trip(pipe, 900, 3)
    starvation = pipe.starvation(10)
    assert starvation is not None
    assert starvation.needed_steps == 18
