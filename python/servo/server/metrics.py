"""Prometheus metrics of one server process (its own registry, no global state)."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from servo.server.auth import Reason
from servo.server.robot_metrics import RobotMetrics

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
_MS_BUCKETS = (0.5, 1, 2, 5, 10, 20, 35, 50, 75, 100, 150, 250, 500, 1000, 2500, 5000)
#: Requests the status reply's recent queue wait and forward time look at.
RECENT_WINDOW = 64
#: The signed doors (`servo.server.signed_door`), each with series from the start (the session
#: opens' door budget too: ``servo_door_dropped_total{door="session"}``).
DOORS = ("status", "audit", "trajectory")


class RecentHistogram(Histogram):
    """A histogram that also keeps its last `RECENT_WINDOW` observations.

    Observed from the inference worker thread, read from the event loop (`recent_median`):
    ``deque.append`` and ``list(deque)`` are atomic under the GIL.
    """

    def __init__(self, name: str, documentation: str, *, buckets: Sequence[float], registry: CollectorRegistry) -> None:
        super().__init__(name, documentation, buckets=buckets, registry=registry)
        self._recent: deque[float] = deque(maxlen=RECENT_WINDOW)

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        """Record ``amount`` in the histogram and the recent window."""
        super().observe(amount, exemplar)
        self._recent.append(amount)

    def recent_median(self) -> float:
        """Median of the recent window (0 before the first observation)."""
        recent = list(self._recent)
        return statistics.median(recent) if recent else 0.0


class ServerMetrics:
    """Counters and histograms; updated from the worker thread and the event loop (thread-safe).

    ``registry`` holds the replica-wide series; the per-robot ones (`robots`) are kept apart and
    written after them by `render`.

    Args:
        robot_labels: Most robots with series of their own (`RobotMetrics`); the rest are ``other``.
    """

    def __init__(self, robot_labels: int = 256) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.active_sessions = Gauge("servo_active_sessions", "Open sessions", registry=r)
        self.max_sessions = Gauge("servo_max_sessions", "Session capacity", registry=r)
        self.warmed_up = Gauge("servo_warmed_up", "1 once the policy is warmed up", registry=r)
        self.chunk_duration_ms = Gauge(
            "servo_chunk_duration_ms", "What one chunk lasts on the robot: chunk_size / fps (ms)", registry=r
        )
        self.draining = Gauge("servo_draining", "1 while draining", registry=r)
        self.requests = Counter("servo_requests", "Served inference requests", ["outcome"], registry=r)
        self.superseded = Counter("servo_superseded_observations", "Observations replaced before inference", registry=r)
        self.copies = Counter(
            "servo_copies", "Requests sent again by their client, by what answered them", ["outcome"], registry=r
        )
        self.observations_rejected = Counter(
            "servo_observations_rejected",
            "Observations dropped before the mailbox, unanswered "
            "(key, header, session, too_large, mac, epoch, replay, stale, rate, image)",
            ["reason"],
            registry=r,
        )
        self.control_rejected = Counter(
            "servo_control_rejected",
            "Control requests (reset, close) refused before acting (header, session, too_large, mac, epoch, replay)",
            ["reason"],
            registry=r,
        )
        # Every reason exists from the start, at 0: an alert on increase() sees the first rejection.
        for reason in get_args(Reason):
            self.observations_rejected.labels(reason)
            self.control_rejected.labels(reason)
        self.unknown_session_notices = Counter(
            "servo_unknown_session_notices",
            "Keyless unknown_session notices sent to clients whose session this replica does not know",
            registry=r,
        )
        self.door_signatures = Counter(
            "servo_door_signatures",
            "Replies (answers and refusals) signed by a signed door (status, audit, trajectory)",
            ["door"],
            registry=r,
        )
        self.door_dropped = Counter(
            "servo_door_dropped",
            "Queries to a signed door (or session opens) dropped unanswered beyond a budget (budget: door, requester)",
            ["door", "budget"],
            registry=r,
        )
        for door in DOORS:
            self.door_signatures.labels(door)
        for door, budget in (*((d, b) for d in DOORS for b in ("door", "requester")), ("session", "door")):
            self.door_dropped.labels(door, budget)
        self.sessions_opened = Counter("servo_sessions_opened", "Session opens accepted", registry=r)
        self.sessions_rejected = Counter("servo_sessions_rejected", "Session opens rejected", ["code"], registry=r)
        self.sessions_collected = Counter(
            "servo_sessions_collected", "Sessions closed by the server", ["reason"], registry=r
        )
        self.queue_wait_ms = RecentHistogram(
            "servo_queue_wait_ms",
            "Observation wait before inference (ms)",
            buckets=_MS_BUCKETS,
            registry=r,
        )
        self.inference_ms = RecentHistogram(
            "servo_inference_ms",
            "Pre+predict+post time per request (ms)",
            buckets=_MS_BUCKETS,
            registry=r,
        )

        self.batch_size = Histogram(
            "servo_batch_size",
            "Observations served per forward (1 unless the policy batches)",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.robots = RobotMetrics(robot_labels)

    def render(self) -> bytes:
        """Prometheus text exposition: the replica's series (`registry`), then every robot's."""
        return generate_latest(self.registry) + self.robots.exposition()
