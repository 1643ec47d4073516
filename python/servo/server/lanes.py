"""Observation intake spread over the server's cores: one lane per core, one session per lane.

Zenoh hands every observation of every session to one callback thread (the subscriber's). What
an observation costs the server before it can wait for the device — the copy out of Zenoh, the
MAC over ~1.8 MB, checks and the JPEG decodes — all release the GIL, so on a many-core GPU box
one thread doing them in turn bounds the requests served, not the device (issue 27). `IntakeLanes`
keeps the callback thread for routing only and runs the work (`ObservationIntake.on_sample`) on
``lanes`` threads ("servo-intake-<n>"). A session's observations always take the same lane,
picked from its key, so they are verified in the order they came: the replay check (a seq_id
strictly above the last accepted) never refuses one that merely overtook another.

Zenoh's network thread never runs any of it: the subscriber's callback runs on zenoh-python's
callback thread, fed by a 256-deep queue that Zenoh fills without the GIL. A callback run on the
network thread itself must take the GIL first, and Zenoh reads nothing from that link meanwhile;
once that wait outlasts the robot's lease (a policy holding the GIL, or a starved thread holding it
at load 20 on 2 cores), Zenoh closes the live link and both ends see the other vanish ("server
liveliness lost", `tests/server/test_busy_server.py`). With lanes the callback thread only routes
(a hash and a FIFO put) and the lane does the work; with one lane the callback thread does it.
A full lane (its FIFO holds `LANE_DEPTH` observations, as many as zenoh-python's queue) makes the
routing thread do that observation itself: zenoh-python's queue then fills, as without lanes, and
congestion control decides.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable

import zenoh
from zenoh.handlers import Callback

from servo.logs import LogThrottle, get_logger
from servo.stages import StageFull, StageThread

log = get_logger(__name__)

#: Observations a lane holds beyond the one it works on (zenoh-python's callback queue is as deep).
LANE_DEPTH = 256
#: Most lanes ``serving.intake_threads = 0`` picks: past this the device, not the intake, bounds.
MAX_AUTO_LANES = 8


def auto_lanes() -> int:
    """One lane per core this process may run on, at most `MAX_AUTO_LANES`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_AUTO_LANES))


class IntakeLanes:
    """Routes each observation sample to its session's lane (`callback` is the subscriber's).

    Called on zenoh-python's callback thread (`callback`); each lane thread runs ``handle`` for
    the samples routed to it, in order. `close` (any thread) stops the lanes: samples still waiting
    are dropped (the server is going away).

    Args:
        handle: What an observation sample goes through (`ObservationIntake.on_sample`); it
            handles its own errors (an exception escaping it is logged, once a second at most).
        lanes: Lane threads; 1 runs ``handle`` on the callback thread itself.
    """

    def __init__(self, handle: Callable[[zenoh.Sample], None], lanes: int) -> None:
        if lanes < 1:
            raise ValueError(f"lanes must be at least 1, got {lanes}")
        self._handle = handle
        self._lanes = [StageThread(f"servo-intake-{n}", capacity=LANE_DEPTH) for n in range(lanes)] if lanes > 1 else []
        self._throttle = LogThrottle(1.0)

    def callback(self) -> Callback[zenoh.Sample]:
        """The observation subscriber's callback: on zenoh-python's callback thread, never Zenoh's own."""
        return Callback(self)

    @property
    def lanes(self) -> int:
        """Threads observations are spread over (1: the callback thread itself)."""
        return max(1, len(self._lanes))

    def lane_of(self, key: str) -> int:
        """The lane of the session publishing on ``key`` (stable: the same key, the same lane)."""
        return zlib.crc32(key.encode()) % self.lanes

    def __call__(self, sample: zenoh.Sample) -> None:
        """The callback thread: hand ``sample`` to its session's lane (one lane: work on it here)."""
        if not self._lanes:
            self._run(sample)
            return
        future = self._lanes[self.lane_of(str(sample.key_expr))].submit(self._run, sample)
        refused = future.exception(timeout=0) if future.done() else None  # a full lane refuses at once
        if isinstance(refused, StageFull):
            self._run(sample)  # this thread works instead, and zenoh-python's queue waits for it

    def _run(self, sample: zenoh.Sample) -> None:
        try:
            self._handle(sample)
        except Exception:  # a bug must cost one observation, not the lane
            if (suppressed := self._throttle.allow("intake")) is not None:
                log.exception("observation intake failed", key=str(sample.key_expr), suppressed=suppressed)

    def close(self) -> None:
        """Stop every lane after the observation it works on; waiting ones are dropped."""
        for lane in self._lanes:
            lane.close()
