"""Every step once: the real control tick, pipeline, queue and recorder on a virtual clock, checked
from the recording alone (`servo.edge.exactness.check_steps`), whatever the delays.

Per request the draw picks how many ticks late the engine gets to its observation, how many
ticks the chunk takes to come back, its length, the delay estimate it ships with; RTC on or off;
up to 8 requests in a row. Chunks merge between ticks (the queue's own proptest,
``rust/queue/exact_tests.rs``, interleaves a merge with the ticks at every step).
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servo._core import Provenance
from servo.edge.actions import ActionFeed, ControlConfig
from servo.edge.channel import Bell, ControlChannel
from servo.edge.exactness import StepReport, check_steps
from servo.edge.observation import ObservationInput
from servo.edge.pipeline import DELAY_WINDOW, ChunkPipeline, FloatArray, PipelineConfig, Request
from servo.edge.recorder import Recorder
from servo.edge.safety import SafetyLimiter
from servo.edge.ticker import Ticker
from servo.recording import FrameRecord, read_recording
from servo.robots.sim import SimConfig, SimSO100
from servo.wire import encode_tensor

TICKS = 160


@dataclass(frozen=True)
class Ask:
    """One request: its observation is taken ``late`` ticks before the engine gets to it (and after
    the previous merge), the chunk (``length`` steps) comes back ``flight`` ticks after that, and
    the request ships a delay estimate of ``estimate_ms``."""

    late: int
    flight: int
    length: int
    estimate_ms: int


asks = st.builds(
    Ask,
    late=st.integers(0, 3),
    flight=st.integers(0, 14),
    length=st.integers(1, 40),
    estimate_ms=st.integers(0, 600),
)


class LeRobotRule(ChunkPipeline):
    """What the edge did before positions travelled with observations: the queue index read when
    the engine gets to the observation, and LeRobot's ``min(real_delay, consumed)``."""

    def snapshot(self, obs: ObservationInput) -> Request:
        self.read_late = self.queue.get_action_index()
        return super().snapshot(obs)

    def complete(
        self,
        request: Request,
        chunk_model: FloatArray,
        chunk_robot: FloatArray,
        now_ns: int,
        *,
        session_id: str,
        seq_id: int,
    ) -> int | None:
        real_delay = math.ceil((now_ns - request.obs.mono_ns) / self.dt_ns)
        provenance = Provenance(session_id, seq_id, request.episode_id, request.obs.mono_ns, request.obs.tick)
        return self.queue.merge(chunk_model, chunk_robot, real_delay, self.read_late, provenance=provenance)


def run(rtc: bool, plan: list[Ask], pipeline: type[ChunkPipeline] = ChunkPipeline) -> StepReport:
    """Tick `TICKS` times, asking as `plan` says, recording every tick; the recording's report."""
    sim = SimSO100(SimConfig(cameras=()))
    spec = sim.spec
    pipe = pipeline(spec.action_dim, spec.fps, PipelineConfig(rtc=rtc, execution_horizon=4), ControlConfig())
    channel = ControlChannel.create(spec.action_dim, shared=False, recording=True)
    read_fd, write_fd = os.pipe()
    feed = ActionFeed(pipe.queue, pipe.counters, ControlConfig())
    ticker = Ticker(sim, feed, SafetyLimiter(spec), channel, Bell(write_fd))
    rest = np.tile(np.asarray(spec.rest_pose, np.float32), (64, 1))
    dt = pipe.dt_ns
    seen: list[ObservationInput] = []
    pending: tuple[int, Request, int] | None = None  # merge tick, request, length
    waiting = list(plan)
    ready_at = plan[0].late
    sim.connect()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.servo"
        recorder = Recorder(path, spec)
        recorder.start()
        try:
            ticker.start()
            for tick in range(TICKS):
                now = tick * dt
                if pending is not None and pending[0] == tick:
                    _, request, length = pending
                    pipe.complete(request, rest[:length], rest[:length], now, session_id="ab" * 16, seq_id=tick)
                    pending = None
                    if waiting:
                        ready_at = tick + waiting[0].late
                ticker.tick(now)
                latest = channel.latest()
                assert latest is not None
                seen.append(ObservationInput(latest[3].copy(), {}, latest[1], latest[0], latest[2]))
                if pending is None and waiting and tick >= ready_at:
                    ask = waiting.pop(0)
                    obs = seen[tick - ask.late]
                    assert pipe.current(obs)  # taken since the last merge
                    for _ in range(DELAY_WINDOW):
                        pipe.recent.add(ask.estimate_ms * 1_000_000)
                    pending = (tick + 1 + ask.flight, pipe.snapshot(obs), ask.length)
                for entry in channel.drain():
                    recorder.record(entry)
        finally:
            recorder.close()
            sim.disconnect()
            os.close(read_fd)
            os.close(write_fd)
        return check_steps(read_recording(path).frames)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rtc=st.booleans(), plan=st.lists(asks, min_size=1, max_size=8))
def test_no_step_runs_twice_or_is_skipped_without_a_reason(rtc: bool, plan: list[Ask]) -> None:
    report = run(rtc, plan)
    assert report.exact, report.summary()
    assert report.unverified == 0


def test_the_traced_late_chunk_ran_a_step_twice_under_the_old_rule() -> None:
    """Issue 30's trace, replayed: the engine gets to an observation 2 ticks late and the chunk
    comes back 1 tick later. Measured from the index read late, LeRobot's rule trims too little."""
    plan = [Ask(0, 0, 8, 0), Ask(2, 1, 30, 0)]
    old = run(True, plan, LeRobotRule)
    assert [v.rule for v in old.duplicated] == ["duplicated"], old.summary()
    assert run(True, plan).exact


def test_the_check_reads_what_the_recorder_wrote() -> None:
    """Each rule on hand-made frames: a duplicate, an early step, a skip inside a chunk, a chunk
    that started too far, and one whose observation frame is missing."""

    state = encode_tensor(np.zeros(6, np.float32))

    def frame(tick: int, seq: int | None = None, obs_tick: int = 0, step: int = 0) -> FrameRecord:
        mono = tick * 1000
        if seq is None:
            return FrameRecord(tick, mono, state, None, "fallback")
        return FrameRecord(tick, mono, state, state, "policy", ("ab" * 16, seq, 0, obs_tick * 1000), step)

    exact = [frame(0, 1, 0, 0), frame(1, 1, 0, 1), frame(2), frame(3, 2, 1, 2), frame(4, 2, 1, 3)]
    assert check_steps(exact).exact
    assert check_steps(exact).chunks == 2
    twice = [frame(0, 1, 0, 0), frame(1, 1, 0, 1), frame(2, 2, 1, 1)]
    assert [v.rule for v in check_steps(twice).duplicated] == ["duplicated"]
    early = [frame(0, 1, 0, 3)]
    assert [v.rule for v in check_steps(early).early] == ["early"]
    gap = [frame(0, 1, 0, 0), frame(1, 1, 0, 2)]
    assert [v.rule for v in check_steps(gap).skipped] == ["skipped inside a chunk"]
    too_far = [frame(0, 1, 0, 0), frame(1, 1, 0, 1), frame(2, 2, 1, 2), frame(3, 3, 2, 5)]
    report = check_steps(too_far)
    assert [(v.tick, v.expected) for v in report.skipped] == [(3, 3)], report.summary()
    missing = [frame(0, 1, 0, 0), frame(5, 2, 3, 5)]
    assert check_steps(missing).unverified == 1
