"""The observability tests' fleet: what ``servo-fleet up`` runs (`servo.deploy.local`), every member
stopped at the end."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from servo.deploy.local import FleetPlan, LocalFleet


@contextmanager
def running_fleet(workdir: Path, *, replicas: int = 2, robots: int = 3) -> Iterator[LocalFleet]:
    """A router, replicas, simulated robots and the monitor (on a free port), each robot with its own identity."""
    fleet = LocalFleet(workdir / "fleet", FleetPlan(replicas=replicas, robots=robots, http_port=0))
    fleet.start()
    try:
        yield fleet
    finally:
        fleet.stop()
