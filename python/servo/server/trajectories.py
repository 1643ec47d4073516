"""The server's trajectory library: recorded episodes handed out whole, for local replay.

One request returns a whole trajectory (docs/design/replay.md: shipped once at arm time, drained
locally), never one frame per request. Every recording is read once, when the server starts (`load`, on a worker
thread): the control plane answers from memory and never reads a file on the event loop.

Who may fetch (`TrajectoryDoor`), cheapest check first: a request signed by a robot identity at
all; a robot the server's one admission rule lets in (`servo.access.Access.robot`: enrolled
robots under their own names, any robot only on an open door); within its budget (per robot
key); and only then its signature checked (`servo.wire.trajectory`). Every answer is encrypted
to the request's ephemeral X25519 key (`seal_trajectory`: nobody on the link reads it) and signed
by the replica's identity over the request's nonce (`servo.wire.sealed`, and
`servo.wire.trust.rejection_transcript` for a refusal): a robot replays only what its own server
sent for its own request, and obeys no refusal it cannot verify.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec

from servo._core import PUBLIC_KEY_SIZE, SIGNATURE_SIZE, AuthError, verify_signature
from servo.access import Access, Denied
from servo.identity import Identity
from servo.logs import get_logger
from servo.recording import read_recording
from servo.server.admission import KeyedBuckets
from servo.server.manifest import TrajectoryEntry
from servo.wire import (
    NONCE_SIZE,
    TRAJECTORY_CONTEXT,
    Rejection,
    Trajectory,
    TrajectoryList,
    TrajectoryRequest,
    WireError,
    decode,
    encode,
    encode_tensor,
    fingerprint,
    rejection_transcript,
    trajectory_request_transcript,
)
from servo.wire.sealed import seal_reply

log = get_logger(__name__)

#: Trajectory requests answered per second per robot key, and the burst.
FETCHES_PER_S = 5.0
FETCH_BURST = 20


@dataclass(frozen=True)
class Signed:
    """A reply body and the attachment that proves it (the replica's signature and what it covers). Frozen."""

    body: bytes
    attachment: bytes


def seal_trajectory(request: TrajectoryRequest, body: bytes, identity: Identity, replica: str) -> Signed | Rejection:
    """``body`` sealed to ``request.client_key`` (`servo.wire.sealed`), signed by ``identity`` for ``replica``.

    A request without a usable key or nonce is refused (unsigned: it came from no client this
    version makes).
    """
    if len(request.nonce) != NONCE_SIZE:
        return Rejection("bad_request", f"a trajectory request carries a {NONCE_SIZE}-byte nonce")
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


class TrajectoryDoor:
    """Answers the trajectory queryable for the robots the admission rule lets in. Event loop.

    Args:
        library: The trajectories.
        access: The server's admission rule.
        identity: The replica's identity (signs each answer and refusal).
        prefix: The replica's key prefix (bound into what the robot signs).
        replica: The replica's name (bound into what the replica signs).
        rate: Requests answered per second per robot key (and ``burst`` at once).
    """

    def __init__(
        self,
        library: TrajectoryLibrary,
        access: Access,
        identity: Identity,
        *,
        prefix: str,
        replica: str,
        rate: float = FETCHES_PER_S,
        burst: int = FETCH_BURST,
    ) -> None:
        self._library, self._access, self._identity = library, access, identity
        self._prefix, self._replica = prefix, replica
        self._budget, self._rate = KeyedBuckets(rate, burst), rate

    def answer(self, payload: bytes) -> Signed | Rejection:
        """The sealed answer to a trajectory request (bounded by the caller), or its signed refusal."""
        try:
            request = decode(payload, TrajectoryRequest)
        except WireError as exc:
            return Rejection("bad_request", str(exc))
        answer = self._admit(request) or self._library.lookup(request)
        if isinstance(answer, Rejection):
            transcript = rejection_transcript(request.nonce, self._replica, request.name, answer.code, answer.reason)
            return msgspec.structs.replace(answer, signature=self._identity.sign(transcript))
        return seal_trajectory(request, encode(answer), self._identity, self._replica)

    def _admit(self, request: TrajectoryRequest) -> Rejection | None:
        key = request.robot_key
        if len(key) != PUBLIC_KEY_SIZE or len(request.signature) != SIGNATURE_SIZE or not request.client_id:
            return Rejection(
                "unauthenticated",
                "a trajectory request is signed by the robot asking (since wire schema 3): upgrade the client",
            )
        caller = self._access.robot(request.client_id, key)
        if isinstance(caller, Denied):
            return Rejection("unauthenticated", caller.reason)
        if not self._budget.take(key):
            return Rejection("rate_limited", f"more than {self._rate:g} trajectory requests per second; retry")
        if not verify_signature(key, trajectory_request_transcript(request, self._prefix), request.signature):
            return Rejection(
                "unauthenticated", f"the trajectory request's signature by {fingerprint(key)} does not verify"
            )
        return None
