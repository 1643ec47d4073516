"""FailSafe: the transitions of docs/design/failsafe.md, on an injected clock."""

from __future__ import annotations

import pytest

from servo.edge.failsafe import MAX_TRANSITIONS, EngineState, FailSafe, FailSafeConfig

S = 1_000_000_000


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000 * S

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> int:
        self.now += round(seconds * S)
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fs(clock: FakeClock) -> FailSafe:
    return FailSafe(FailSafeConfig(degraded_after_s=1.0, timeout_streak=2, max_offline_s=10.0), clock=clock)


def states(fs: FailSafe) -> list[EngineState]:
    return [t.state for t in fs.transitions]


def test_connecting_until_the_first_merge(fs: FailSafe, clock: FakeClock) -> None:
    assert fs.state is EngineState.CONNECTING
    fs.session_opened()
    clock.advance(5.0)
    assert fs.tick(starved_since_ns=clock.now) is EngineState.CONNECTING  # starving is expected
    fs.request_sent()
    fs.merged()
    assert fs.state is EngineState.STREAMING
    assert states(fs) == [EngineState.CONNECTING, EngineState.STREAMING]


def test_degraded_when_a_request_is_out_too_long(fs: FailSafe, clock: FakeClock) -> None:
    fs.merged()
    fs.request_sent()
    clock.advance(1.0)
    assert fs.tick(starved_since_ns=0) is EngineState.STREAMING  # not *more* than 1 s yet
    clock.advance(0.001)
    assert fs.tick(starved_since_ns=0) is EngineState.DEGRADED
    fs.merged()
    assert fs.state is EngineState.STREAMING


def test_degraded_when_the_queue_runs_dry_before_the_chunk_is_due(fs: FailSafe, clock: FakeClock) -> None:
    fs.merged()
    fs.request_sent()
    # 0.5 s of actions left, chunks take 0.4 s: they arrive in time.
    assert fs.tick(starved_since_ns=0, runway_ns=S // 2, expected_rtt_ns=4 * S // 10) is EngineState.STREAMING
    # The server slowed down: 0.7 s round trips against 0.5 s of actions. Forecast, long before 1 s.
    assert fs.tick(starved_since_ns=0, runway_ns=S // 2, expected_rtt_ns=7 * S // 10) is EngineState.DEGRADED
    assert fs.reason == "the queue runs dry before the chunk is expected back"
    fs.merged()
    assert fs.state is EngineState.STREAMING


def test_an_overdue_request_is_degraded_just_before_the_queue_is_dry(fs: FailSafe, clock: FakeClock) -> None:
    fs.merged()
    fs.request_sent()
    clock.advance(0.5)  # expected back after 0.2 s: overdue
    assert fs.tick(starved_since_ns=0, runway_ns=S // 10, expected_rtt_ns=S // 5) is EngineState.STREAMING
    assert fs.tick(starved_since_ns=0, runway_ns=S // 25, expected_rtt_ns=S // 5) is EngineState.DEGRADED


def test_no_degraded_while_idle(fs: FailSafe, clock: FakeClock) -> None:
    fs.merged()  # nothing outstanding: the queue is simply full
    clock.advance(30.0)
    assert fs.tick(starved_since_ns=0) is EngineState.STREAMING


def test_stalled_when_the_control_loop_starves(fs: FailSafe, clock: FakeClock) -> None:
    fs.merged()
    merged_at = clock.now
    clock.advance(0.5)
    assert fs.tick(starved_since_ns=merged_at - 1) is EngineState.STREAMING  # before the merge
    fs.request_sent()
    clock.advance(1.5)
    assert fs.tick(starved_since_ns=clock.now) is EngineState.STALLED  # wins over DEGRADED
    fs.merged()
    assert fs.state is EngineState.STREAMING


def test_degraded_then_stalled(fs: FailSafe, clock: FakeClock) -> None:
    fs.merged()
    fs.request_sent()
    clock.advance(1.5)
    assert fs.tick(starved_since_ns=0) is EngineState.DEGRADED
    clock.advance(0.5)
    assert fs.tick(starved_since_ns=clock.now) is EngineState.STALLED
    assert states(fs)[-3:] == [EngineState.STREAMING, EngineState.DEGRADED, EngineState.STALLED]


def test_timeout_streak_means_lost(fs: FailSafe, clock: FakeClock) -> None:
    fs.merged()
    fs.request_sent()
    assert fs.request_timed_out() is False
    fs.request_sent()
    fs.merged()  # a success breaks the streak
    fs.request_sent()
    assert fs.request_timed_out() is False
    fs.request_sent()
    assert fs.request_timed_out() is True
    assert fs.timeouts == 3
    fs.lost("2 requests in a row timed out")
    assert fs.state is EngineState.RECONNECTING
    assert fs.reconnects == 1
    assert fs.reason == "2 requests in a row timed out"


def test_reconnecting_then_streaming_again(fs: FailSafe, clock: FakeClock) -> None:
    fs.merged()
    fs.lost("server liveliness lost")
    assert fs.tick(starved_since_ns=clock.now) is EngineState.RECONNECTING  # not STALLED
    clock.advance(3.0)
    fs.session_opened()
    assert fs.state is EngineState.CONNECTING
    fs.merged()
    assert states(fs) == [
        EngineState.CONNECTING,
        EngineState.STREAMING,
        EngineState.RECONNECTING,
        EngineState.CONNECTING,
        EngineState.STREAMING,
    ]
    assert fs.reconnects == 1
    assert not fs.dead.is_set()


def test_dead_after_max_offline(fs: FailSafe, clock: FakeClock) -> None:
    fs.merged()
    clock.advance(4.0)  # the offline clock runs from the last good chunk, not from the loss
    fs.lost("server liveliness lost")
    clock.advance(6.0)
    assert fs.tick(starved_since_ns=0) is EngineState.RECONNECTING  # exactly 10 s
    clock.advance(0.001)
    assert fs.tick(starved_since_ns=0) is EngineState.DEAD
    assert fs.dead.is_set()
    assert "offline" in fs.reason


def test_dead_when_never_connected(clock: FakeClock) -> None:
    fs = FailSafe(FailSafeConfig(degraded_after_s=1.0, timeout_streak=2, max_offline_s=2.0), clock=clock)
    clock.advance(2.5)
    assert fs.tick(starved_since_ns=0) is EngineState.DEAD


def test_dead_on_fatal(fs: FailSafe) -> None:
    fs.merged()
    fs.fatal("server came back with a different model")
    assert fs.state is EngineState.DEAD
    assert fs.dead.is_set()
    assert fs.reason == "server came back with a different model"


def test_nothing_leaves_dead(fs: FailSafe, clock: FakeClock) -> None:
    fs.fatal("contract violation")
    for event in (fs.session_opened, fs.merged, fs.request_sent, fs.request_failed):
        event()
    fs.lost("again")
    fs.fatal("another")
    clock.advance(100.0)
    assert fs.tick(starved_since_ns=clock.now) is EngineState.DEAD
    assert fs.state is EngineState.DEAD
    assert fs.reason == "contract violation"
    assert states(fs) == [EngineState.CONNECTING, EngineState.DEAD]


def test_a_flapping_link_keeps_only_the_last_transitions(fs: FailSafe, clock: FakeClock) -> None:
    fs.merged()
    for _ in range(MAX_TRANSITIONS):  # STREAMING -> STALLED -> STREAMING, twice per round
        clock.advance(0.01)
        fs.tick(starved_since_ns=clock.now)
        clock.advance(0.01)
        fs.merged()
    assert len(fs.transitions) == MAX_TRANSITIONS
    assert states(fs)[-2:] == [EngineState.STALLED, EngineState.STREAMING]


def test_each_stall_is_counted_with_the_cause_the_engine_gives(fs: FailSafe, clock: FakeClock) -> None:
    causes = iter(["chunks too short: 10 steps, need >= 24", "a chunk is late"])
    fs.merged()
    for _ in range(2):
        fs.request_sent()
        clock.advance(1.0)
        assert fs.tick(starved_since_ns=clock.now, why_starved=lambda: next(causes)) is EngineState.STALLED
        clock.advance(0.1)
        fs.tick(starved_since_ns=clock.now, why_starved=lambda: next(causes))  # still stalled: not asked again
        fs.merged()
    assert fs.stall_causes == {"chunks too short: 10 steps, need >= 24": 1, "a chunk is late": 1}
    stalls = [t.reason for t in fs.transitions if t.state is EngineState.STALLED]
    assert stalls[0] == "no fresh action for the control loop: chunks too short: 10 steps, need >= 24"
