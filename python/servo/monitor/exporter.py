"""The fleet as Prometheus metrics: what robots report about themselves, and what the monitor sees of replicas.

Servers export their own series (``servo_*``, per robot ``servo_robot_*``) on their ops ports;
the monitor adds what only telemetry knows (``servo_edge_*{robot}``: state, round trip,
fallback, lateness, chunks the edge rejected, how old the last record is) and what the monitor
sees of each replica (``servo_fleet_replica_*{replica}``: token present, draining, load). Built
from the `FleetView` at every scrape, so a robot's series exist exactly as long as the monitor
knows the robot: the robots the fleet enrolled, and at most ``max_robots`` trusted on first use
when asked to; a name nobody enrolled adds no series, only a count by reason.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from servo.client import REJECT_REASONS
from servo.edge.failsafe import EngineState
from servo.monitor.fleet import FleetView

_STATES = [state.value for state in EngineState]


class FleetExporter(Collector):
    """A Prometheus collector over a `FleetView`; scraped on the monitor's event loop (its HTTP handler)."""

    def __init__(self, view: FleetView) -> None:
        self.view = view
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def render(self) -> bytes:
        """Prometheus text exposition."""
        return generate_latest(self.registry)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """The families, built from the view now."""
        yield from self._robots()
        yield from self._replicas()
        refused = CounterMetricFamily(
            "servo_monitor_telemetry_refused",
            "Telemetry records (and replica answers: unverified) the monitor refused, by reason",
            labels=["reason"],
        )
        for reason, count in sorted(self.view.refused.items()):
            refused.add_metric([reason], count)
        yield refused

    def _robots(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        robot = ["robot"]
        age = GaugeMetricFamily("servo_edge_telemetry_age_seconds", "Time since the robot's last record", labels=robot)
        up = GaugeMetricFamily("servo_edge_up", "1 while the robot reports (its record is not stale)", labels=robot)
        stopped = GaugeMetricFamily(
            "servo_edge_stopped", "1 once the robot's last record said goodbye (stopped on purpose)", labels=robot
        )
        state = GaugeMetricFamily("servo_edge_state", "1 for the robot's fail-safe state", labels=[*robot, "state"])
        rtt = GaugeMetricFamily("servo_edge_rtt_ms", "Round trip of its requests (ms)", labels=[*robot, "quantile"])
        queue = GaugeMetricFamily("servo_edge_queue_depth", "Actions queued on the robot", labels=robot)
        delay = GaugeMetricFamily("servo_edge_delay_steps", "Inference delay the robot ships (steps)", labels=robot)
        lateness = GaugeMetricFamily(
            "servo_edge_tick_lateness_p99_ms", "Control-tick lateness p99 over the last period (ms)", labels=robot
        )
        fallback = CounterMetricFamily("servo_edge_fallback_ticks", "Ticks without a fresh action", labels=robot)
        missed = CounterMetricFamily("servo_edge_missed_deadlines", "Control ticks past their deadline", labels=robot)
        reconnects = CounterMetricFamily("servo_edge_reconnects", "Sessions lost and re-opened", labels=robot)
        rejected = CounterMetricFamily(
            "servo_edge_chunks_rejected", "Server messages the edge rejected, by reason", labels=[*robot, "reason"]
        )
        info = GaugeMetricFamily(
            "servo_edge_info", "The robot's replica, model and codec", labels=[*robot, "replica", "model", "codec"]
        )
        snapshot = self.view.snapshot()["robots"]
        for r in snapshot:
            name = [r["id"]]
            age.add_metric(name, r["age_s"])
            up.add_metric(name, 0.0 if r["stale"] else 1.0)
            stopped.add_metric(name, 1.0 if r["goodbye"] else 0.0)
            for value in _STATES:
                state.add_metric([*name, value], 1.0 if r["state"] == value else 0.0)
            for quantile, key in (("0.5", "rtt_p50"), ("0.99", "rtt_p99")):
                if r[key] is not None:
                    rtt.add_metric([*name, quantile], r[key])
            queue.add_metric(name, r["queue_depth"])
            delay.add_metric(name, r["delay_steps"])
            if r["lateness_p99"] is not None:
                lateness.add_metric(name, r["lateness_p99"])
            fallback.add_metric(name, r["fallback_ticks"])
            missed.add_metric(name, r["missed_deadlines"])
            reconnects.add_metric(name, r["reconnects"])
            # Every reason from the start, at 0: an alert on increase() sees the first rejection.
            for reason in sorted({*REJECT_REASONS, *r["chunks_rejected"]}):
                rejected.add_metric([*name, reason], r["chunks_rejected"].get(reason, 0))
            info.add_metric([*name, r["replica"], r["model"], r["codec"]], 1.0)
        yield from (age, up, stopped, state, rtt, queue, delay, lateness, fallback, missed, reconnects, rejected, info)

    def _replicas(self) -> Iterator[GaugeMetricFamily]:
        labels = ["replica", "app", "model"]
        up = GaugeMetricFamily("servo_fleet_replica_up", "1 while the replica's liveliness token exists", labels=labels)
        draining = GaugeMetricFamily("servo_fleet_replica_draining", "1 while the replica drains", labels=labels)
        load = GaugeMetricFamily("servo_fleet_replica_load", "Open sessions over capacity", labels=labels)
        sessions = GaugeMetricFamily("servo_fleet_replica_sessions", "Open sessions", labels=labels)
        for r in self.view.snapshot()["replicas"]:
            name = [r["replica"], r["app"], r["model"]]
            up.add_metric(name, 1.0 if r["up"] else 0.0)
            draining.add_metric(name, 1.0 if r["draining"] else 0.0)
            if r["load"] is not None:
                load.add_metric(name, r["load"])
                sessions.add_metric(name, r["sessions"])
        yield from (up, draining, load, sessions)
