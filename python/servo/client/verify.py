"""What a client checks before a server message may reach a robot, and what it counts.

A chunk is merged into the robot's queue only if, in this order (wire schema 3): its tag verifies
under the session key (which decrypts it); its session id and epoch are the session's; it answers the request in
flight (``stale_seq`` otherwise: one request in flight, a late or replayed chunk is never merged);
its body decodes; both tensors are float32 (``dtype``), shaped ``(T, A)`` with ``A`` the robot's
action dimension and ``1 <= T <= max_steps`` (``shape``), and finite (``non_finite``). Anything
else is dropped and counted by reason in `ClientCounters`, logged at most once per reason per
second (with the count held back).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from servo._core import Header
from servo.client.results import ChunkResult
from servo.errors import ProtocolError
from servo.logs import LogThrottle, get_logger
from servo.wire import ActionChunk, Tensor, WireError, decode, decode_floats

log = get_logger(__name__)

FloatArray = npt.NDArray[np.float32]

#: Why a server message was not merged (the keys of `ClientStatistics.chunks_rejected`).
RejectReason = Literal["mac", "session", "epoch", "stale_seq", "shape", "dtype", "non_finite", "undecodable"]
REJECT_REASONS: tuple[RejectReason, ...] = get_args(RejectReason)
#: Longest chunk a client accepts by default (steps); the robot's queue holds 4096 rows.
MAX_CHUNK_STEPS = 1024


class ChunkRejected(ProtocolError):
    """A chunk (or another server message) that must not reach the robot."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def check_chunk(body: ActionChunk, *, action_dim: int, max_steps: int) -> tuple[FloatArray, FloatArray]:
    """``(chunk_model, chunk_robot)`` of an authenticated chunk, or why it is unusable.

    ``chunk_model`` is ``chunk_robot`` when the server shipped one tensor.

    Raises:
        ChunkRejected: ``undecodable``, ``dtype``, ``shape`` or ``non_finite``.
    """
    robot = _tensor(body.chunk_robot, "chunk_robot", action_dim, max_steps)
    if body.chunk_model is None:
        return robot, robot
    model = _tensor(body.chunk_model, "chunk_model", action_dim, max_steps)
    if model.shape != robot.shape:
        raise ChunkRejected("shape", f"chunk_model has shape {model.shape}, chunk_robot {robot.shape}")
    return model, robot


def read_chunk(header: Header, payload: bytes, now_ns: int, *, action_dim: int, max_steps: int) -> ChunkResult:
    """The result an authenticated chunk answering ``header``'s request carries (arrived at ``now_ns``).

    Raises:
        ChunkRejected: its tensors are unusable (`check_chunk`).
        WireError: the body does not decode.
    """
    body = decode(payload, ActionChunk)
    chunk_model, chunk_robot = check_chunk(body, action_dim=action_dim, max_steps=max_steps)
    return ChunkResult(
        seq_id=header.seq_id,
        episode_id=header.episode_id,
        chunk_model=chunk_model,
        chunk_robot=chunk_robot,
        obs_mono_ns=header.client_mono_ns,
        rtt_ns=now_ns - header.client_mono_ns,
        queue_wait_ms=body.queue_wait_ms,
        inference_ms=body.inference_ms,
        superseded=body.superseded,
        server_load=body.server_load,
    )


def _tensor(tensor: Tensor, what: str, action_dim: int, max_steps: int) -> FloatArray:
    if tensor.dtype != "float32":
        raise ChunkRejected("dtype", f"{what} is {tensor.dtype}, expected float32")
    try:
        array = decode_floats(tensor, what=what)
    except WireError as exc:
        raise ChunkRejected("undecodable", str(exc)) from None
    if array.ndim != 2 or array.shape[1] != action_dim:
        raise ChunkRejected("shape", f"{what} has shape {array.shape}, expected (T, {action_dim})")
    if not 1 <= array.shape[0] <= max_steps:
        raise ChunkRejected("shape", f"{what} has {array.shape[0]} steps, expected 1..{max_steps}")
    if not np.isfinite(array).all():
        raise ChunkRejected("non_finite", f"{what} contains NaN or inf")
    return array


@dataclass(frozen=True)
class ClientStatistics:
    """A snapshot of what a `PolicyClient` refused, over all its sessions.

    Attributes:
        chunks_rejected: Server messages not merged, by reason (every reason present, 0 or more).
        rogue_servers: Replicas skipped: untrusted identity, inconsistent status, or a session
            ack whose signature did not verify.
        undecodable_status: Status replies that did not decode (skipped).
        unknown_session_hints: ``unknown_session`` notices signed by the replica and acted on (each: a
            re-handshake); forged ones are counted in ``chunks_rejected["mac"]``.
        resent: Requests sent again because their answer was overdue (`RemoteSession.resend`).
    """

    chunks_rejected: dict[str, int]
    rogue_servers: int
    undecodable_status: int
    unknown_session_hints: int
    resent: int


@dataclass
class ClientCounters:
    """Counters shared by a `PolicyClient` and its sessions. Written and read on the event loop."""

    chunks_rejected: Counter[str] = field(default_factory=Counter)
    rogue_servers: int = 0
    undecodable_status: int = 0
    unknown_session_hints: int = 0
    resent: int = 0
    _throttle: LogThrottle = field(default_factory=lambda: LogThrottle(1.0), repr=False)

    def reject(self, reason: RejectReason, detail: str, **context: object) -> None:
        """Count one refused server message; log it unless this reason logged within the second."""
        self.chunks_rejected[reason] += 1
        if (suppressed := self._throttle.allow(("chunk", reason))) is not None:
            log.warning("server message rejected", reason=reason, detail=detail, suppressed=suppressed, **context)

    def rogue(self, replica: str, detail: str) -> None:
        """Count one replica skipped as untrusted or forged."""
        self.rogue_servers += 1
        if (suppressed := self._throttle.allow(("rogue", replica))) is not None:
            log.warning("replica skipped", replica=replica, detail=detail, suppressed=suppressed)

    def untrusted(self, replica: str, detail: str) -> None:
        """Count one replica skipped because its identity is not the one trusted: logged as an error."""
        self.rogue_servers += 1
        if (suppressed := self._throttle.allow(("untrusted", replica))) is not None:
            log.error("replica refused: untrusted identity", replica=replica, detail=detail, suppressed=suppressed)

    def undecodable(self, detail: str) -> None:
        """Count one status reply that did not decode."""
        self.undecodable_status += 1
        if (suppressed := self._throttle.allow("status")) is not None:
            log.warning("ignoring undecodable status reply", error=detail, suppressed=suppressed)

    def snapshot(self) -> ClientStatistics:
        """A frozen copy."""
        return ClientStatistics(
            chunks_rejected={reason: self.chunks_rejected[reason] for reason in REJECT_REASONS},
            rogue_servers=self.rogue_servers,
            undecodable_status=self.undecodable_status,
            unknown_session_hints=self.unknown_session_hints,
            resent=self.resent,
        )
