"""Edge telemetry: records built from the edge's own snapshots, encrypted to the operators and signed,
published from the event loop."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zenoh

from servo._core import ServerIdentity
from servo.edge.failsafe import FailSafe, FailSafeConfig
from servo.edge.remote import RemoteEngine
from servo.edge.runtime import RunOptions
from servo.edge.stats import EngineStats
from servo.edge.telemetry import TelemetryPublisher
from servo.recording import read_recording
from servo.wire import (
    TELEMETRY_SELECTOR,
    EdgeTelemetry,
    WireError,
    decode,
    fingerprint,
    open_telemetry,
    telemetry_key,
    telemetry_signer,
)
from tests.edge.harness import edge_config, running_edge, small_sim
from tests.support import client_settings, eventually, make_manifest, running_server

pytestmark = pytest.mark.anyio

IDENTITY = ServerIdentity.from_seed(bytes(range(32)))
#: The operator the server names in its acks: the robot encrypts its records to it.
MONITOR = ServerIdentity.from_seed(bytes(range(5, 37)))


class Clock:
    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def __call__(self) -> int:
        return self.ns


def stats(**changes: object) -> EngineStats:
    values: dict[str, object] = {
        "state": "streaming",
        "chunks_received": 5,
        "chunks_dropped": 0,
        "requests": 6,
        "timeouts": 0,
        "errors": 0,
        "reconnects": 1,
        "fallback_ticks": 3,
        "stale_refusals": 0,
        "queue_depth": 12,
        "delay_steps": 2,
        "rtt_ms_p50": 20.0,
        "rtt_ms_p99": 40.0,
        "replica": "r0",
        "model": "m",
    }
    return EngineStats(**{**values, **changes})  # type: ignore[arg-type]


def lateness(fine_bins: dict[int, int]) -> np.ndarray:
    counts = np.zeros(1100, np.uint64)
    for index, n in fine_bins.items():
        counts[index] = n
    return counts


def test_a_record_carries_the_new_transitions_and_the_recent_lateness() -> None:
    clock = Clock()
    failsafe = FailSafe(FailSafeConfig(degraded_after_s=1, timeout_streak=2, max_offline_s=60), clock=clock)
    publisher = TelemetryPublisher(IDENTITY)
    clock.ns += 10_000_000
    failsafe.merged()  # -> streaming, 10 ms after the start
    clock.ns += 5_000_000
    first = publisher.record("robot-7", stats(), failsafe, lateness({1: 99, 50: 1}), 0, clock.ns)
    assert [(t.state, t.reason, t.age_ms) for t in first.transitions] == [
        ("connecting", "start", 15.0),
        ("streaming", "chunk merged", 5.0),
    ]
    assert first.last_transition == first.transitions[-1]
    assert first.tick_lateness_ms_p99 == pytest.approx(0.02)
    assert (first.seq, first.state, first.replica, first.queue_depth, first.fallback_ticks) == (
        0,
        "streaming",
        "r0",
        12,
        3,
    )

    clock.ns += 1_000_000_000
    failsafe.lost("server liveliness lost")
    second = publisher.record("robot-7", stats(state="reconnecting"), failsafe, lateness({1: 99, 50: 101}), 2, clock.ns)
    assert [(t.state, t.reason) for t in second.transitions] == [("reconnecting", "server liveliness lost")]
    assert second.seq == 1
    assert second.missed_deadlines == 2
    # Only the 100 ticks since the previous record count: all of them 0.5 ms late.
    assert second.tick_lateness_ms_p99 == pytest.approx(0.51)
    third = publisher.record("robot-7", stats(), failsafe, lateness({1: 99, 50: 101}), 2, clock.ns)
    assert third.transitions == []
    assert third.last_transition is not None
    assert third.last_transition.state == "reconnecting"
    assert third.tick_lateness_ms_p99 is None  # no tick since


async def test_a_running_edge_publishes_records_only_its_operators_read(port: int, tmp_path: Path) -> None:
    """Signed by the robot, encrypted to the operator its server named: the operator reads them, a
    stranger subscribed to the same key reads nothing (issue 29: anyone could). And its recording
    holds the same transitions, with the edge's clock pair to place them."""
    received: list[tuple[bytes, EdgeTelemetry]] = []
    refused: list[str] = []
    raw: list[bytes] = []
    lock = threading.Lock()

    def on_sample(sample: zenoh.Sample) -> None:
        body = sample.payload.to_bytes()
        attachment = None if sample.attachment is None else sample.attachment.to_bytes()
        try:
            _, signer = telemetry_signer(str(sample.key_expr), len(body), attachment)
            opened = open_telemetry(str(sample.key_expr), body, attachment, MONITOR)
        except WireError as exc:
            refused.append(str(exc))
            return
        with lock:
            raw.append(body)
            received.append((signer, opened))

    operators = f'[security]\noperators = [{{name = "ops", identity = "{fingerprint(MONITOR.public_key)}"}}]\n'
    async with running_server(make_manifest(port, extra=operators)) as (_, ready):
        monitor = zenoh.open(client_settings(port).to_config())
        try:
            monitor.declare_subscriber(TELEMETRY_SELECTOR, on_sample)
            sim = small_sim()
            engine = RemoteEngine(edge_config(port, client_id="robot-7"), sim.spec())
            before = time.time_ns()
            options = RunOptions(
                telemetry=TelemetryPublisher(IDENTITY, period_s=0.2), record_path=str(tmp_path / "ep.servo")
            )
            async with running_edge(sim, engine, options) as run:
                await eventually(
                    lambda: any(r.state == "streaming" and r.rtt_ms_p50 is not None for _, r in received),
                    15,
                    "a streaming record",
                )
                await run.stop()
            await eventually(lambda: len(received) >= 3 and received[-1][1].goodbye != "", 5, "the goodbye")
        finally:
            monitor.close()
    assert refused == []
    # Only the last record of the run says goodbye, and why the run ended (a stop, not a crash).
    assert [r.goodbye for _, r in received[:-1]] == [""] * (len(received) - 1)
    assert received[-1][1].goodbye == "test done"
    keys = {key for key, _ in received}
    assert keys == {IDENTITY.public_key}
    records = [r for _, r in received]
    assert {r.client_id for r in records} == {"robot-7"}
    seqs = [r.seq for r in records]
    assert seqs == sorted(set(seqs))  # in order, never repeated
    assert len({r.run for r in records}) == 1
    for body in raw:  # what a stranger on the key gets
        with pytest.raises(WireError):
            decode(body, EdgeTelemetry)
        assert ready.keys.replica.encode() not in body
    streaming = next(r for r in records if r.state == "streaming")
    assert streaming.replica == ready.keys.replica
    assert streaming.codec in ("raw", "jpeg95", "jpeg90", "jpeg80")
    seen = [t.state for r in records for t in r.transitions]
    assert seen[:2] == ["connecting", "streaming"]  # every transition reported once, in order
    assert len(seen) == len([t for r in records for t in r.transitions])
    assert telemetry_key("robot-7") == "@servo/@robots/robot-7/telemetry"

    recording = read_recording(tmp_path / "ep.servo")
    recorded = [(state, reason) for frame in recording.frames for _, state, reason in frame.transitions]
    assert recorded[:2] == [("connecting", "start"), ("streaming", "chunk merged")]
    first = recording.frames[0]
    wall = recording.header.wall_ns(first.mono_ns)
    assert wall is not None
    assert before <= wall <= time.time_ns()
