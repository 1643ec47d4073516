"""Per-robot Prometheus metrics with bounded label cardinality.

A robot (a client id) gets its own ``robot`` label when its session opens and loses it, every
series of it removed, when its last session here closes; at most ``cap`` robots are labelled
at once. Everything else is counted under ``robot="other"``: robots beyond the cap, and
observations refused for a client id that holds no session here (anybody can put any client id
in a key on a flat network, so such ids never become labels).

Every series is paid for at every scrape (prometheus_client renders ~10 µs per line), so a robot
gets few: its queue wait and inference time as summaries (count and sum: their mean per robot;
the replica-wide histograms hold the distribution), and only its staleness, what a runbook reads
per robot, as a histogram of eight buckets.
"""

from __future__ import annotations

import threading
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, Summary
from prometheus_client.metrics import MetricWrapperBase

M = TypeVar("M", bound=MetricWrapperBase)

#: The label of every robot without a label of its own.
OTHER = "other"
#: Coarser than the fleet-wide histograms: these exist once per robot.
_ROBOT_MS_BUCKETS = (5, 10, 20, 50, 100, 250, 1000, 5000)


class RobotMetrics:
    """The per-robot series of one server.

    `attach` and `detach` run on the event loop (session open and close); `served` and
    `rejected` on the inference worker, its reply thread and Zenoh's callback thread. One lock
    covers choosing a label and updating its series, so a series is never re-created for a robot
    whose session just closed.

    Args:
        registry: Where the metrics live (the server's own registry).
        cap: Most robots labelled at once (0: every robot is ``other``).
    """

    def __init__(self, registry: CollectorRegistry, cap: int) -> None:
        self._cap = cap
        self._lock = threading.Lock()
        #: robot -> the label values of every series created for it (removed at detach).
        self._series: dict[str, set[tuple[MetricWrapperBase, tuple[str, ...]]]] = {}
        r = registry
        self.requests = Counter(
            "servo_robot_requests", "Requests answered per robot, by outcome", ["robot", "outcome"], registry=r
        )
        self.superseded = Counter(
            "servo_robot_superseded_observations", "Observations replaced before inference", ["robot"], registry=r
        )
        self.observations_rejected = Counter(
            "servo_robot_observations_rejected",
            "Observations dropped before the mailbox, by reason (see servo_observations_rejected)",
            ["robot", "reason"],
            registry=r,
        )
        self.queue_wait_ms = Summary(
            "servo_robot_queue_wait_ms", "Observation wait before inference (ms)", ["robot"], registry=r
        )
        self.inference_ms = Summary(
            "servo_robot_inference_ms", "Pre+predict+post time per request (ms)", ["robot"], registry=r
        )
        self.staleness_ms = Histogram(
            "servo_robot_staleness_ms",
            "Age of the observation when its answer left (arrival to publish, ms)",
            ["robot"],
            buckets=_ROBOT_MS_BUCKETS,
            registry=r,
        )

    @property
    def labelled(self) -> list[str]:
        """The robots holding a label of their own now."""
        with self._lock:
            return sorted(self._series)

    def attach(self, client_id: str) -> None:
        """A session of ``client_id`` opened: label it, unless the cap is reached."""
        with self._lock:
            if client_id not in self._series and len(self._series) < self._cap:
                self._series[client_id] = set()

    def detach(self, client_id: str) -> None:
        """``client_id`` holds no session here any more: remove every series of it."""
        with self._lock:
            for metric, values in self._series.pop(client_id, ()):
                metric.remove(*values)

    def served(
        self,
        client_id: str,
        outcome: str,
        queue_wait_ms: float,
        inference_ms: float,
        staleness_ms: float,
        superseded: int,
    ) -> None:
        """One request answered (a chunk, or an error ``outcome``)."""
        with self._lock:
            robot = self._label(client_id)
            self._child(self.requests, robot, outcome).inc()
            self._child(self.queue_wait_ms, robot).observe(queue_wait_ms)
            self._child(self.inference_ms, robot).observe(inference_ms)
            self._child(self.staleness_ms, robot).observe(staleness_ms)
            if superseded:
                self._child(self.superseded, robot).inc(superseded)

    def rejected(self, client_id: str | None, reason: str) -> None:
        """An observation under ``client_id``'s key was dropped before the mailbox."""
        with self._lock:
            self._child(self.observations_rejected, self._label(client_id), reason).inc()

    def _label(self, client_id: str | None) -> str:
        return client_id if client_id is not None and client_id in self._series else OTHER

    def _child(self, metric: M, robot: str, *rest: str) -> M:
        values = (robot, *rest)
        series = self._series.get(robot)
        if series is not None:
            series.add((metric, values))
        return metric.labels(*values)
