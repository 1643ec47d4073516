"""Per-robot Prometheus metrics with bounded label cardinality.

A robot (a client id) gets its own ``robot`` label when its session opens and loses it, every
series of it removed, when its last session here closes; at most ``cap`` robots are labelled
at once. Everything else is counted under ``robot="other"``: robots beyond the cap, and
observations refused for a client id that holds no session here (anybody can put any client id
in a key on a flat network, so such ids never become labels).

A robot gets few series: its queue wait and inference time as summaries (count and sum: their
mean per robot; the replica-wide histograms hold the distribution), and only its staleness, what
a runbook reads per robot, as a histogram of eight buckets.

What they cost is what monitoring a fleet costs a GPU server (benches/bench_monitoring.py), so
they are plain numbers per robot, a few additions per request under one lock, written as
exposition text only when scraped and, for a robot that did not change since the last scrape,
not written again. prometheus_client's labelled children cost ~20 µs a request in label lookups
and their generic writer ~25 µs a line (~25 lines per robot: 59 ms a scrape for 100 robots on a
loaded 2-core VM); this writes the same samples in 3.5 ms. prometheus_client's ``_created``
series are not written: one more series per robot and family that nothing of servo reads.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import utils

#: How prometheus_client writes a sample value (``3.0``, ``+Inf``), so both parts of /metrics agree.
_number: Callable[[float], str] = utils.floatToGoString

#: The label of every robot without a label of its own.
OTHER = "other"
#: Coarser than the fleet-wide histograms: these exist once per robot.
_ROBOT_MS_BUCKETS = (5, 10, 20, 50, 100, 250, 1000, 5000)
_LE = (*(_number(b) for b in _ROBOT_MS_BUCKETS), "+Inf")

#: (exposition name, type, help), in the order every robot's lines are written.
_FAMILIES = (
    ("servo_robot_requests_total", "counter", "Requests answered per robot, by outcome"),
    ("servo_robot_superseded_observations_total", "counter", "Observations replaced before inference"),
    (
        "servo_robot_observations_rejected_total",
        "counter",
        "Observations dropped before the mailbox, by reason (see servo_observations_rejected)",
    ),
    ("servo_robot_queue_wait_ms", "summary", "Observation wait before inference (ms)"),
    ("servo_robot_inference_ms", "summary", "Pre+predict+post time per request (ms)"),
    ("servo_robot_staleness_ms", "histogram", "Age of the observation when its answer left (arrival to publish, ms)"),
)
_HEADERS = tuple(f"# HELP {name} {text}\n# TYPE {name} {kind}\n" for name, kind, text in _FAMILIES)


@dataclass(eq=False)
class _Robot:
    """One label's numbers; read and written under `RobotMetrics`' lock only.

    ``version`` counts changes, so a scrape keeps the ``lines`` it wrote from a snapshot only if
    nothing changed while it wrote them.
    """

    label: str
    requests: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    superseded: int = 0
    served: int = 0
    queue_wait_ms: float = 0.0
    inference_ms: float = 0.0
    staleness_ms: float = 0.0
    #: Observations per staleness bucket (not cumulative), the last one above every bound.
    staleness_buckets: list[int] = field(default_factory=lambda: [0] * (len(_ROBOT_MS_BUCKETS) + 1))
    version: int = 0
    #: This robot's lines of each family of `_FAMILIES`, as of ``lines_version``.
    lines: tuple[str, ...] = ()
    lines_version: int = -1

    def snapshot(self) -> _Robot:
        return _Robot(
            self.label,
            dict(self.requests),
            dict(self.rejected),
            self.superseded,
            self.served,
            self.queue_wait_ms,
            self.inference_ms,
            self.staleness_ms,
            list(self.staleness_buckets),
            self.version,
        )

    def write(self) -> tuple[str, ...]:
        """This robot's lines of each family (a snapshot's, written outside the lock)."""
        robot, g = self.label, _number
        requests = "".join(
            f'servo_robot_requests_total{{{robot},outcome="{o}"}} {g(n)}\n' for o, n in self.requests.items()
        )
        superseded = (
            f"servo_robot_superseded_observations_total{{{robot}}} {g(self.superseded)}\n" if self.superseded else ""
        )
        rejected = "".join(
            f'servo_robot_observations_rejected_total{{{robot},reason="{r}"}} {g(n)}\n'
            for r, n in self.rejected.items()
        )
        if not self.served:
            return requests, superseded, rejected, "", "", ""
        count = g(self.served)
        queue_wait = _summary("servo_robot_queue_wait_ms", robot, count, g(self.queue_wait_ms))
        inference = _summary("servo_robot_inference_ms", robot, count, g(self.inference_ms))
        cumulative, buckets = 0, []
        for le, n in zip(_LE, self.staleness_buckets, strict=True):
            cumulative += n
            buckets.append(f'servo_robot_staleness_ms_bucket{{{robot},le="{le}"}} {g(cumulative)}\n')
        buckets.append(f"servo_robot_staleness_ms_count{{{robot}}} {count}\n")
        buckets.append(f"servo_robot_staleness_ms_sum{{{robot}}} {g(self.staleness_ms)}\n")
        return requests, superseded, rejected, queue_wait, inference, "".join(buckets)


class RobotMetrics:
    """The per-robot series of one server.

    `attach` and `detach` run on the event loop (session open and close); `served` and
    `rejected` on the inference worker, its reply thread and Zenoh's callback thread;
    `exposition` on the event loop (a scrape). One lock covers choosing a label and updating its
    numbers, so a series is never re-created for a robot whose session just closed; a scrape holds
    it only to copy the robots that changed, never while writing text.

    Args:
        cap: Most robots labelled at once (0: every robot is ``other``).
    """

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._lock = threading.Lock()
        #: Labelled robots by client id, in the order they were labelled.
        self._robots: dict[str, _Robot] = {}
        #: Everything counted under ``other`` (made on first use, never removed).
        self._other: _Robot | None = None

    @property
    def labelled(self) -> list[str]:
        """The robots holding a label of their own now."""
        with self._lock:
            return sorted(self._robots)

    def attach(self, client_id: str) -> None:
        """A session of ``client_id`` opened: label it, unless the cap is reached.

        A client named ``other`` stays under ``other``: its own series would repeat that label.
        """
        with self._lock:
            if client_id != OTHER and client_id not in self._robots and len(self._robots) < self._cap:
                self._robots[client_id] = _Robot(f'robot="{_escape(client_id)}"')

    def detach(self, client_id: str) -> None:
        """``client_id`` holds no session here any more: remove every series of it."""
        with self._lock:
            self._robots.pop(client_id, None)

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
            robot = self._robot(client_id)
            robot.requests[outcome] = robot.requests.get(outcome, 0) + 1
            robot.served += 1
            robot.queue_wait_ms += queue_wait_ms
            robot.inference_ms += inference_ms
            robot.staleness_ms += staleness_ms
            robot.staleness_buckets[bisect.bisect_left(_ROBOT_MS_BUCKETS, staleness_ms)] += 1
            robot.superseded += superseded
            robot.version += 1

    def rejected(self, client_id: str | None, reason: str) -> None:
        """An observation under ``client_id``'s key was dropped before the mailbox."""
        with self._lock:
            robot = self._robot(client_id)
            robot.rejected[reason] = robot.rejected.get(reason, 0) + 1
            robot.version += 1

    def exposition(self) -> bytes:
        """Every per-robot series as Prometheus text (format 0.0.4), grouped by family."""
        with self._lock:
            robots = [*self._robots.values(), *(() if self._other is None else (self._other,))]
            changed = {i: robot.snapshot() for i, robot in enumerate(robots) if robot.lines_version != robot.version}
        written = {i: snapshot.write() for i, snapshot in changed.items()}
        with self._lock:
            for i, lines in written.items():
                if robots[i].version == changed[i].version:
                    robots[i].lines, robots[i].lines_version = lines, changed[i].version
        families: list[list[str]] = [[header] for header in _HEADERS]
        for i, robot in enumerate(robots):
            # A robot that changed since its snapshot shows as of the snapshot, like any scrape.
            for family, text in zip(families, written.get(i, robot.lines), strict=True):
                family.append(text)
        return "".join(text for family in families for text in family).encode()

    def _robot(self, client_id: str | None) -> _Robot:
        robot = None if client_id is None else self._robots.get(client_id)
        if robot is not None:
            return robot
        if self._other is None:
            self._other = _Robot(f'robot="{OTHER}"')
        return self._other


def _summary(name: str, robot: str, count: str, total: str) -> str:
    return f"{name}_count{{{robot}}} {count}\n{name}_sum{{{robot}}} {total}\n"


def _escape(value: str) -> str:
    """A label value as the text format quotes it."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
