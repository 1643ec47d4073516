"""The explicit table of inference engines: what ``inference`` names (``--inference``, ``--replay``)."""

from __future__ import annotations

from collections.abc import Callable

from servo.edge.config import EdgeConfig
from servo.edge.engine import EngineBase
from servo.robots.protocol import RobotSpec


def _remote(config: EdgeConfig, spec: RobotSpec) -> EngineBase:
    from servo.edge.remote import RemoteEngine

    return RemoteEngine(config, spec)


def _sync(config: EdgeConfig, spec: RobotSpec) -> EngineBase:
    from servo.edge.local import SyncEngine

    return SyncEngine(config, spec)


def _rtc(config: EdgeConfig, spec: RobotSpec) -> EngineBase:
    from servo.edge.local import RtcEngine

    return RtcEngine(config, spec)


def _replay(config: EdgeConfig, spec: RobotSpec) -> EngineBase:
    from servo.edge.replay import ReplayEngine

    return ReplayEngine(config, spec)


#: Engine factories by name; each imports its engine when built (local engines: torch only then).
ENGINES: dict[str, Callable[[EdgeConfig, RobotSpec], EngineBase]] = {
    "remote": _remote,
    "sync": _sync,
    "rtc": _rtc,
    "replay": _replay,
}


def make_engine(config: EdgeConfig, spec: RobotSpec) -> EngineBase:
    """Build the engine ``config.inference`` names."""
    return ENGINES[config.inference](config, spec)
