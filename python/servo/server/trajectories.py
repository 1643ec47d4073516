"""The server's trajectory library: recorded episodes handed out whole, for local replay.

One request returns a whole trajectory (seeds/002: ship once at arm time, drain locally), never
one frame per request.
"""

from __future__ import annotations

from collections.abc import Sequence

from servo.logs import get_logger
from servo.recording import read_recording
from servo.server.manifest import TrajectoryEntry
from servo.wire import (
    Rejection,
    Trajectory,
    TrajectoryList,
    TrajectoryRequest,
    WireError,
    decode,
    encode_tensor,
)

log = get_logger(__name__)


class TrajectoryLibrary:
    """Named trajectories loaded lazily from recordings. Used from the event loop."""

    def __init__(self, entries: Sequence[TrajectoryEntry]) -> None:
        self._paths = {e.name: e.path for e in entries}
        self._cache: dict[str, Trajectory] = {}

    def answer(self, payload: bytes) -> Trajectory | TrajectoryList | Rejection:
        """Reply to a trajectory query (bounded by the caller): the list (empty name) or one whole trajectory."""
        try:
            request = decode(payload, TrajectoryRequest)
        except WireError as exc:
            return Rejection("bad_request", str(exc))
        if not request.name:
            return TrajectoryList(sorted(self._paths))
        if request.name not in self._paths:
            return Rejection(
                "bad_request",
                f"no trajectory {request.name!r}; available: {', '.join(sorted(self._paths)) or 'none'}",
            )
        try:
            return self.get(request.name)
        except (OSError, WireError) as exc:
            log.warning("trajectory unreadable", name=request.name, error=str(exc))
            return Rejection("bad_request", f"trajectory {request.name!r} cannot be read: {exc}")

    def get(self, name: str) -> Trajectory:
        """Load (once) and return a trajectory."""
        if name not in self._cache:
            recording = read_recording(self._paths[name])
            self._cache[name] = Trajectory(
                name=name,
                joint_names=list(recording.header.joint_names),
                fps=recording.header.fps,
                positions=encode_tensor(recording.actions()),
            )
            log.info("trajectory loaded", name=name, frames=len(recording.frames))
        return self._cache[name]
