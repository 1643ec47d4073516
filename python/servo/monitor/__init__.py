"""``servo-monitor``: a live page of the fleet, served by servo itself.

The monitor joins the Zenoh network like any member (behind `servo-router` as a ``monitor``:
read-only by construction), verifies every robot's signed telemetry (`servo.wire.telemetry`),
asks replicas for their status and recent requests, and serves a page, its JSON and Prometheus
metrics (`servo.monitor.web`).
"""

from servo.monitor.fleet import FleetView
from servo.monitor.service import MonitorConfig, MonitorReady, run_monitor
from servo.monitor.trust import RobotTrust, TrustError, load_pins

__all__ = ["FleetView", "MonitorConfig", "MonitorReady", "RobotTrust", "TrustError", "load_pins", "run_monitor"]
