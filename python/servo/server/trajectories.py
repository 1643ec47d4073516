"""The server's trajectory library: recorded episodes handed out whole, for local replay.

One request returns a whole trajectory (docs/design/replay.md: shipped once at arm time, drained
locally), never one frame per request. Every recording is read once, when the server starts (`load`, on a worker
thread): the control plane answers from memory and never reads a file on the event loop.

Who may fetch (`TrajectoryDoor`, a signed door: `servo.server.signed_door`), cheapest check
first: within the door's budget (everybody together) and the robot key's; a request signed by a
robot identity at all; a robot the server's one admission rule lets in now
(`servo.access.Access.robot`: enrolled robots under their own names, any robot only on an open
door); and only then its signature checked (`servo.wire.trajectory`). Every answer is encrypted
to the request's ephemeral X25519 key (`seal_trajectory`: nobody on the link reads it) and signed
by the replica's identity over the request's nonce (`servo.wire.sealed`, and
`servo.wire.trust.rejection_transcript` for a refusal): a robot replays only what its own server
sent for its own request, and obeys no refusal it cannot verify. Beyond a budget: silence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from servo._core import PUBLIC_KEY_SIZE, SIGNATURE_SIZE, AuthError
from servo.access import Access, Caller, Denied
from servo.logs import get_logger
from servo.recording import read_recording
from servo.server.manifest import LimitsSection, TrajectoryEntry
from servo.server.metrics import ServerMetrics
from servo.server.signed_door import Signed, SignedDoor
from servo.wire import (
    NONCE_SIZE,
    TRAJECTORY_CONTEXT,
    Rejection,
    Trajectory,
    TrajectoryList,
    TrajectoryRequest,
    WireError,
    encode,
    encode_tensor,
    fingerprint,
    rejection_transcript,
    trajectory_request_transcript,
)
from servo.wire.sealed import Signer, seal_reply

log = get_logger(__name__)


def seal_trajectory(request: TrajectoryRequest, body: bytes, identity: Signer, replica: str) -> Signed | Rejection:
    """``body`` sealed to ``request.client_key`` (`servo.wire.sealed`), signed by ``identity`` for ``replica``.

    A request without a usable key is refused (unsigned: it came from no client this version makes).
    """
    try:
        ciphertext, attachment = seal_reply(
            body,
            client_key=request.client_key,
            nonce=request.nonce,
            context=TRAJECTORY_CONTEXT,
            question=[request.nonce, replica, request.name],
            signer=identity,
        )
    except AuthError as exc:
        return Rejection(
            "bad_request",
            f"client_key refused: {exc} (since wire schema 3 a trajectory request carries the X25519 key its "
            "answer is encrypted to: upgrade the client)",
        )
    return Signed(ciphertext, attachment)


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

    def lookup(self, request: TrajectoryRequest) -> Trajectory | TrajectoryList | Rejection:
        """The list of names (an empty name), one whole trajectory, or why not (unsigned yet)."""
        if not request.name:
            return TrajectoryList(sorted(self._trajectories))
        found = self._trajectories.get(request.name)
        if found is None:
            available = ", ".join(sorted(self._trajectories)) or "none"
            return Rejection("bad_request", f"no trajectory {request.name!r}; available: {available}")
        return Rejection("bad_request", found) if isinstance(found, str) else found


class TrajectoryDoor(SignedDoor[TrajectoryRequest]):
    """Answers the trajectory queryable for the robots the admission rule lets in. Event loop.

    A signed door (`servo.server.signed_door`): its answers and its refusals are signed (the
    robot obeys no refusal it cannot verify), so nothing is signed before both budgets.

    Args:
        library: The trajectories.
        access: The server's admission rule.
        identity: The replica's identity (signs each answer and refusal).
        metrics: Where its signatures and dropped queries are counted.
        limits: ``[limits]``: the door's budgets.
        prefix: The replica's key prefix (bound into what the robot signs).
        replica: The replica's name (bound into what the replica signs).
    """

    request_type = TrajectoryRequest
    door = "trajectory"

    def __init__(
        self,
        library: TrajectoryLibrary,
        access: Access,
        identity: Signer,
        metrics: ServerMetrics,
        limits: LimitsSection,
        *,
        prefix: str,
        replica: str,
    ) -> None:
        super().__init__(identity, metrics, limits, prefix=prefix, replica=replica)
        self._library, self._access = library, access

    def malformed(self, request: TrajectoryRequest) -> str | None:
        """Why the request is not one this version's clients send (unsigned, or no nonce)."""
        if (
            len(request.robot_key) != PUBLIC_KEY_SIZE
            or len(request.signature) != SIGNATURE_SIZE
            or not request.client_id
            or len(request.nonce) != NONCE_SIZE
        ):
            return (
                "a trajectory request is signed by the robot asking and carries a "
                f"{NONCE_SIZE}-byte nonce (since wire schema 3): upgrade the client"
            )
        return None

    def signed(self, request: TrajectoryRequest) -> tuple[bytes, bytes, bytes]:
        """The robot's key, the transcript it signs, its signature."""
        return request.robot_key, trajectory_request_transcript(request, self.prefix), request.signature

    def admit(self, request: TrajectoryRequest) -> Caller | Rejection:
        """The robot, if the admission rule admits it now under the name it gives."""
        caller = self._access.robot(request.client_id, request.robot_key)
        return Rejection("unauthenticated", caller.reason) if isinstance(caller, Denied) else caller

    def forged(self, request: TrajectoryRequest) -> str:
        """Why a request whose signature does not verify is refused."""
        return f"the trajectory request's signature by {fingerprint(request.robot_key)} does not verify"

    def respond(self, request: TrajectoryRequest, caller: Caller) -> Signed | Rejection:
        """The list of names or one whole trajectory, sealed to the robot; or why not, signed."""
        answer = self._library.lookup(request)
        if isinstance(answer, Rejection):
            return self.refuse(request, answer)
        return seal_trajectory(request, encode(answer), self.signer, self.replica)

    def refuse(self, request: TrajectoryRequest, rejection: Rejection) -> Rejection:
        """``rejection`` signed over the request's nonce (`servo.wire.trust.rejection_transcript`)."""
        transcript = rejection_transcript(request.nonce, self.replica, request.name, rejection.code, rejection.reason)
        return msgspec.structs.replace(rejection, signature=self.signer.sign(transcript))
