"""The edge's telemetry: an encrypted, signed status record on the robot's own key, about once a second.

Built from the snapshots the edge already keeps (`EngineStats`, the fail-safe's transitions,
the control loop's lateness histogram and counters) on the event loop, never on the control
loop, and published with ``CongestionControl.DROP`` at a low priority: a congested link loses a
record, never delays an observation or blocks the loop. The record is encrypted to its readers
and signed with the robot's Ed25519 identity (`servo.wire.telemetry`); the readers are the
operators the serving replica named in its signed ack (kept while the robot has no server) and
those the edge was given (``telemetry_readers``). With no reader known, nothing is published:
nobody could read it. Monitors verify and decrypt it (`servo.monitor`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import numpy as np
import numpy.typing as npt
import zenoh

from servo._core import AuthError
from servo.edge.channel import lateness_percentiles_ms
from servo.edge.control_loop import ControlLoop
from servo.edge.engine import EngineBase
from servo.edge.failsafe import FailSafe
from servo.edge.stats import EngineStats
from servo.home import ensure_config_dir, telemetry_run_path
from servo.logs import get_logger
from servo.private_files import PrivateFileError, update_private
from servo.wire.telemetry import (
    MAX_REASON_CHARS,
    MAX_TRANSITIONS,
    EdgeTelemetry,
    Signer,
    Transition,
    seal_telemetry,
    telemetry_key,
)

log = get_logger(__name__)

#: How often a robot reports (s).
DEFAULT_PERIOD_S = 1.0


@dataclass
class TelemetryPublisher:
    """Publishes one robot's telemetry. Owned by the event loop (`run` is one of the runtime's tasks).

    Args:
        signer: The robot's identity; every record is signed with it.
        period_s: Time between two records.
        readers: Operators' Ed25519 keys every record is encrypted to (besides the server's).
    """

    signer: Signer
    period_s: float = DEFAULT_PERIOD_S
    readers: list[bytes] = field(default_factory=list)
    #: Counts up across this machine's runs: with ``seq`` it lets a monitor refuse replayed records.
    run_number: int = field(default_factory=lambda: next_run())
    #: Records published (the next record's ``seq``).
    seq: int = 0
    #: Why the run ended on purpose, once it did (the runtime sets it before the last record).
    goodbye: str = ""
    _seen_transitions: int = 0
    _lateness: npt.NDArray[np.uint64] | None = None

    async def run(self, zsession: zenoh.Session, engine: EngineBase, loop: ControlLoop, client_id: str) -> None:
        """Publish until cancelled; a last record goes out as the task ends.

        That record has the final state, and `goodbye` when the run ended on purpose.
        """
        publisher = zsession.declare_publisher(
            telemetry_key(client_id),
            congestion_control=zenoh.CongestionControl.DROP,
            priority=zenoh.Priority.DATA_LOW,
        )
        self._seen_transitions = max(0, engine.failsafe.transition_count - MAX_TRANSITIONS)
        try:
            while True:
                self._publish(publisher, engine, loop, client_id)
                await anyio.sleep(self.period_s)
        finally:
            self._publish(publisher, engine, loop, client_id)
            with contextlib.suppress(zenoh.ZError):
                publisher.undeclare()

    def _publish(self, publisher: zenoh.Publisher, engine: EngineBase, loop: ControlLoop, client_id: str) -> None:
        lateness = loop.channel.lateness_counts()
        missed = loop.statistics().missed_deadlines
        stats = engine.statistics()
        record = self.record(client_id, stats, engine.failsafe, lateness, missed)
        readers = [*stats.readers, *self.readers]
        if not readers:
            log.debug("telemetry not sent: no reader known", seq=record.seq)
            return
        try:
            body, attachment = seal_telemetry(record, self.signer, readers)
        except AuthError as exc:  # a reader's key is no Ed25519 key: the configuration names a wrong one
            log.warning("telemetry not sent", error=str(exc), seq=record.seq)
            return
        try:
            publisher.put(body, attachment=attachment)
        except zenoh.ZError as exc:  # the session is closing: the run is ending anyway
            log.debug("telemetry not sent", error=str(exc))

    def record(
        self,
        client_id: str,
        stats: EngineStats,
        failsafe: FailSafe,
        lateness: npt.NDArray[np.uint64],
        missed_deadlines: int,
        now_ns: int | None = None,
    ) -> EdgeTelemetry:
        """The next record from these snapshots (advances ``seq`` and the transition cursor).

        ``lateness`` is the control loop's whole-run lateness histogram: the record's p99 covers
        the ticks since the previous record.
        """
        now = time.monotonic_ns() if now_ns is None else now_ns
        recent = lateness if self._lateness is None else lateness - self._lateness
        self._lateness = lateness
        p99 = lateness_percentiles_ms(recent, [0.99], 1 << 62)
        new = failsafe.transitions_since(self._seen_transitions)[-MAX_TRANSITIONS:]
        self._seen_transitions = failsafe.transition_count
        last = failsafe.transitions[-1]
        record = EdgeTelemetry(
            client_id=client_id,
            run=self.run_number,
            seq=self.seq,
            period_ms=self.period_s * 1e3,
            state=stats.state,
            replica=stats.replica,
            model=stats.model,
            rtt_ms_p50=stats.rtt_ms_p50,
            rtt_ms_p99=stats.rtt_ms_p99,
            delay_steps=max(0, stats.delay_steps),
            queue_depth=stats.queue_depth,
            fallback_ticks=stats.fallback_ticks,
            tick_lateness_ms_p99=None if p99 is None else p99[0],
            missed_deadlines=missed_deadlines,
            codec="" if stats.codec is None else stats.codec.current,
            requests=stats.requests,
            reconnects=stats.reconnects,
            timeouts=stats.timeouts,
            chunks_rejected={reason: n for reason, n in stats.chunks_rejected.items() if n},
            last_transition=_transition(last.state.value, last.reason, now - last.mono_ns),
            transitions=[_transition(t.state.value, t.reason, now - t.mono_ns) for t in new],
            goodbye=self.goodbye[:MAX_REASON_CHARS],
        )
        self.seq += 1
        return record


def next_run(path: Path | None = None) -> int:
    """This machine's next run number, counted in ``telemetry.run`` in servo's directory.

    Several edges of one machine count in one file, under a lock, and the file is kept like the
    keys beside it (`servo.private_files`: never through a link, this user's alone). If it cannot
    be used the run is numbered by the wall clock in ns (larger than any count), and that is logged.
    """
    path = telemetry_run_path() if path is None else path
    try:
        ensure_config_dir()
        return int(update_private(path, _count_run, what="telemetry run counter"))
    except PrivateFileError as exc:
        log.warning("telemetry runs not counted", path=str(path), error=str(exc))
        return time.time_ns()


def _count_run(text: bytes) -> bytes:
    last = text.decode("ascii", "replace").strip()
    return f"{int(last) + 1 if last.isdigit() else 1}\n".encode()


def _transition(state: str, reason: str, age_ns: int) -> Transition:
    return Transition(state, reason[:MAX_REASON_CHARS], max(0, age_ns) / 1e6)
