"""What an engine reports: a snapshot of its counters (the run summary, the status line, telemetry)."""

from __future__ import annotations

from dataclasses import dataclass, field

from servo.client import REJECT_REASONS
from servo.client.codec import CodecStatus


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of an engine's counters.

    ``chunks_rejected`` counts what never reached the queue, by reason (see
    `servo.client.REJECT_REASONS`); ``rogue_servers`` the replicas skipped as untrusted or forged.
    """

    state: str
    chunks_received: int
    chunks_dropped: int
    requests: int
    timeouts: int
    errors: int
    reconnects: int
    fallback_ticks: int
    stale_refusals: int
    queue_depth: int
    delay_steps: int
    rtt_ms_p50: float | None
    rtt_ms_p99: float | None
    chunks_rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REJECT_REASONS, 0))
    rogue_servers: int = 0
    #: Remote engines: requests sent again because their answer was overdue (`RemoteSession.resend`).
    resent: int = 0
    #: Remote engines: the current session's codec choice and what it measured.
    codec: CodecStatus | None = None
    #: Set while chunks are too short for the round trip (`Starvation.short`): the fix is in the log.
    starving: str = ""
    #: Remote engines: the replica serving the robot and its model ("" while there is none).
    replica: str = ""
    model: str = ""
    #: Remote engines: the operators the serving replica named in its signed ack (the last one's,
    #: kept while there is none): the readers telemetry is encrypted to.
    readers: tuple[bytes, ...] = ()
