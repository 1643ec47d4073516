"""The server's trajectory library: recorded episodes handed out whole, for local replay.

One request returns a whole trajectory (docs/design/replay.md: ship once at arm time, drain locally), never
one frame per request. Every recording is read once, when the server starts (`load`, on a worker
thread): the control plane answers from memory and never reads a file on the event loop. Every
answer is signed by the replica's identity over the request's nonce
(`servo.wire.trust.trajectory_transcript`, `rejection_transcript`): a robot replays only what its
own server sent for its own request, and obeys no refusal it cannot verify.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec

from servo.identity import Identity
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
    encode,
    encode_tensor,
    rejection_transcript,
    trajectory_transcript,
)

log = get_logger(__name__)


@dataclass(frozen=True)
class Signed:
    """A reply body and the replica's signature of it (sent as the reply's attachment). Frozen."""

    body: bytes
    signature: bytes


class TrajectoryLibrary:
    """Named trajectories, in memory. Immutable once built: any thread may answer from it.

    Args:
        trajectories: Each name's trajectory, or why its recording cannot be read (the answer).
    """

    def __init__(self, trajectories: Mapping[str, Trajectory | str]) -> None:
        self._trajectories = dict(trajectories)

    @classmethod
    def load(cls, entries: Sequence[TrajectoryEntry]) -> TrajectoryLibrary:
        """Read every recording of the manifest (blocking: call it off the event loop).

        An unreadable recording is logged and refused by name when asked for; the others serve.
        """
        trajectories: dict[str, Trajectory | str] = {}
        for entry in entries:
            try:
                recording = read_recording(entry.path)
            except (OSError, WireError) as exc:
                log.warning("trajectory unreadable", name=entry.name, path=entry.path, error=str(exc))
                trajectories[entry.name] = f"trajectory {entry.name!r} cannot be read: {exc}"
                continue
            trajectories[entry.name] = Trajectory(
                name=entry.name,
                joint_names=list(recording.header.joint_names),
                fps=recording.header.fps,
                positions=encode_tensor(recording.actions()),
            )
            log.info("trajectory loaded", name=entry.name, frames=len(recording.frames))
        return cls(trajectories)

    def answer(self, payload: bytes, identity: Identity, replica: str) -> Signed | Rejection:
        """Reply to a trajectory query (bounded by the caller), signed by ``identity`` for ``replica``.

        The list of names (an empty name) or one whole trajectory; a refusal is signed too.
        """
        try:
            request = decode(payload, TrajectoryRequest)
        except WireError as exc:
            return Rejection("bad_request", str(exc))
        answer = self._answer(request)
        if isinstance(answer, Rejection):
            transcript = rejection_transcript(request.nonce, replica, request.name, answer.code, answer.reason)
            return msgspec.structs.replace(answer, signature=identity.sign(transcript))
        body = encode(answer)
        return Signed(body, identity.sign(trajectory_transcript(request.nonce, replica, request.name, body)))

    def _answer(self, request: TrajectoryRequest) -> Trajectory | TrajectoryList | Rejection:
        if not request.name:
            return TrajectoryList(sorted(self._trajectories))
        found = self._trajectories.get(request.name)
        if found is None:
            available = ", ".join(sorted(self._trajectories)) or "none"
            return Rejection("bad_request", f"no trajectory {request.name!r}; available: {available}")
        return Rejection("bad_request", found) if isinstance(found, str) else found
