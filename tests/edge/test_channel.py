"""ControlChannel: what the control loop and the edge's main process share besides the queue."""

from __future__ import annotations

import numpy as np
import pytest

from servo._core import Provenance
from servo.edge.channel import (
    LATENESS_BINS,
    RECORD_SLOTS,
    ControlChannel,
    LoopState,
    Slot,
    lateness_bin,
    lateness_percentiles_ms,
)

DIM = 3
SESSION = "c0" * 16


def pair() -> tuple[ControlChannel, ControlChannel]:
    """The main process's view and the control process's view of one shared channel."""
    main = ControlChannel.create(DIM, shared=True, recording=True)
    return main, ControlChannel.attach(main.memory.fileno(), DIM)


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_the_newest_observation_crosses_and_wins() -> None:
    main, loop = pair()
    assert main.latest() is None
    assert main.latest_pose() is None
    loop.publish(0, 100, 7, f32(1, 2, 3))
    loop.publish(1, 200, 2**63 + 5, f32(4, 5, 6))  # a queue position is any u64
    latest = main.latest()
    assert latest is not None
    tick, mono_ns, position, state = latest
    assert (tick, mono_ns, position, state.tolist()) == (1, 200, 2**63 + 5, [4.0, 5.0, 6.0])
    pose = main.latest_pose()
    assert pose is not None
    assert pose.tolist() == [4.0, 5.0, 6.0]


def test_park_commands_are_read_once_and_acknowledged_by_generation() -> None:
    main, loop = pair()
    assert loop.park_command() is None
    first = main.request_park(f32(1, 1, 1), 0.5)
    second = main.request_park(f32(2, 2, 2), 0.25)
    assert second == first + 1
    command = loop.park_command()
    assert command is not None
    generation, tolerance, pose = command
    assert (generation, tolerance, pose.tolist()) == (second, 0.25, [2.0, 2.0, 2.0])  # the newest wins
    assert loop.park_command() is None  # nothing new since
    assert not main.parked(second)
    loop.acknowledge_park(second)
    assert main.parked(first)
    assert main.parked(second)


def test_the_first_fault_wins() -> None:
    main, loop = pair()
    assert main.fault() == ""
    assert loop.raise_fault("policy action refused: target has non-finite values [nan]")
    assert not loop.raise_fault("a later one")
    assert main.fault() == "policy action refused: target has non-finite values [nan]"
    assert main.statistics().fault == main.fault()
    long = ControlChannel.create(DIM, shared=False)
    long.raise_fault("é" * 1000)  # cut to the record, never an error
    assert long.fault().startswith("é")


def test_the_wake_up_is_armed_by_the_main_process_and_taken_once() -> None:
    main, loop = pair()
    assert loop.wake_below() == 0
    main.arm_wake(5)
    assert loop.wake_below() == 5
    assert loop.take_wake()
    assert not loop.take_wake()
    assert loop.wake_below() == 0


def test_records_round_trip_with_provenance_and_are_dropped_when_nobody_drains() -> None:
    main, loop = pair()
    provenance = Provenance(SESSION, 7, 2, 1234, 2**64 - 1)
    loop.record(0, 10, f32(0, 0, 0), None, "none", None)
    loop.record(1, 20, f32(1, 1, 1), f32(1.5, 1.5, 1.5), "policy", provenance)
    loop.record(2, 30, f32(2, 2, 2), f32(0, 0, 0), "park", None)
    ticks = main.drain()
    assert [(t.tick, t.mono_ns, t.source) for t in ticks] == [(0, 10, "none"), (1, 20, "policy"), (2, 30, "park")]
    assert ticks[0].action is None
    assert ticks[1].action is not None
    assert ticks[1].action.tolist() == [1.5, 1.5, 1.5]
    assert ticks[1].provenance == provenance
    assert ticks[2].provenance is None
    assert main.drain() == []
    for tick in range(RECORD_SLOTS + 5):
        loop.record(tick, tick, f32(0, 0, 0), None, "none", None)
    assert len(main.drain()) == RECORD_SLOTS
    assert main.statistics().records_dropped == 5
    quiet = ControlChannel.create(DIM, shared=False)  # not recording: nothing is buffered
    quiet.record(0, 0, f32(0, 0, 0), None, "none", None)
    assert quiet.drain() == []


def test_counters_and_state() -> None:
    main, loop = pair()
    assert main.state is LoopState.STARTING
    loop.set_state(LoopState.RUNNING, realtime=True)
    loop.count(Slot.TICKS, 3)
    loop.count(Slot.MISSED)
    loop.set_state(LoopState.STOPPED)  # keeps the realtime flag it was running with
    stats = main.statistics()
    assert (stats.state, stats.realtime, stats.ticks, stats.missed_deadlines) == (LoopState.STOPPED, True, 3, 1)
    loop.request_stop()
    assert main.stop_requested()


@pytest.mark.parametrize(
    ("ns", "index"),
    [(0, 0), (9_999, 0), (10_000, 1), (9_999_999, 999), (10_000_000, 1000), (999_999_999, 1989), (10**12, 1990)],
)
def test_lateness_bins(ns: int, index: int) -> None:
    assert lateness_bin(ns) == index
    assert index < LATENESS_BINS


def test_lateness_percentiles_are_upper_bounds_capped_at_the_max() -> None:
    main, loop = pair()
    assert main.statistics().lateness_ms == {"p50": None, "p99": None, "max": None}
    for ns in [50_000] * 98 + [2_500_000, -3_000_000]:  # a tick that woke early counts by its distance
        loop.note_lateness(ns)
    stats = main.statistics()
    assert stats.lateness_ms == {"p50": 0.06, "p99": 2.51, "max": 3.0}
    counts = main.lateness_counts()
    assert int(counts.sum()) == 100
    assert lateness_percentiles_ms(counts, [1.0], 2_999_000) == [2.999]
