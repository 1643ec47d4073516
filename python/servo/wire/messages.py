"""Every message body of the protocol (msgpack via msgspec).

Evolution is additive: new fields get defaults, unknown fields are ignored on decode, and a
layout change of an existing field needs a new schema version (negotiated at session open).
Correlation (seq_id, episode, epoch, the client's monotonic stamp) travels in the attachment
header (`servo._core.Header`), never in these bodies. No field carries a wall-clock instant.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from servo import _core
from servo.wire.image import EncodedImage
from servo.wire.tensor import Tensor

# One schema version covers the attachment header and these bodies.
SUPPORTED_SCHEMA_VERSIONS: tuple[int, ...] = tuple(sorted(_core.SUPPORTED_SCHEMA_VERSIONS))


class CameraFeature(msgspec.Struct, frozen=True):
    """Shape of one camera stream (RGB)."""

    height: int
    width: int


class Features(msgspec.Struct, frozen=True):
    """The feature contract between a robot and a policy.

    ``action_names`` order is the sync-safety contract: column i of every chunk drives the motor
    named ``action_names[i]``. ``state_units`` / ``action_units`` name the unit of each value
    (LeRobot's motor normalisation modes: ``degrees``, ``range_m100_100``, ``range_0_100``; any
    other name is compared verbatim); an empty list, or an empty entry, means "not declared".
    """

    state_names: list[str]
    action_names: list[str]
    cameras: dict[str, CameraFeature]
    state_units: list[str] = []
    action_units: list[str] = []


class PolicyInfo(msgspec.Struct, frozen=True):
    """What a server serves, as reported by status and session ack."""

    model: str
    revision: str
    features: Features
    chunk_size: int
    fps: float
    supports_rtc: bool
    chunk_stateless: bool
    serving_mode: Literal["shared", "exclusive"]
    default_task: str = ""
    pin_task: bool = False
    strict_fps: bool = False


class StatusReply(msgspec.Struct, frozen=True):
    """Answer of the status queryable; one per replica."""

    server_id: str
    app: str
    model_key: str
    replica: str
    schema_versions: list[int]
    policy: PolicyInfo
    warmed_up: bool
    draining: bool
    active_sessions: int
    max_sessions: int
    load: float


class SessionOpen(msgspec.Struct, frozen=True):
    """Client -> server: bind this client to the replica and validate capabilities."""

    client_id: str
    schema_versions: list[int]
    features: Features
    fps: float
    task: str = ""
    rtc: bool = False
    session_epoch: int = 0
    tags: dict[str, str] = {}


class SessionAck(msgspec.Struct, frozen=True):
    """Server -> client: the session exists; ``rtc`` is what will actually be applied."""

    session_id: int
    schema_version: int
    server_id: str
    replica: str
    policy: PolicyInfo
    rtc: bool
    task: str
    warnings: list[str] = []


RejectCode = Literal[
    "bad_request",
    "schema_version",
    "action_names",
    "state_names",
    "cameras",
    "units",
    "fps",
    "task",
    "capacity",
    "draining",
    "not_ready",
    "unknown_session",
]


class Rejection(msgspec.Struct, frozen=True):
    """Why a control request was refused; sent as a Zenoh error reply."""

    code: RejectCode
    reason: str
    active_sessions: int = 0
    max_sessions: int = 0
    load: float = 0.0


class ResetRequest(msgspec.Struct, frozen=True, tag="reset"):
    """Episode boundary: the server drops the session's pending observation and processor state."""

    session_id: int
    episode_id: int


class CloseRequest(msgspec.Struct, frozen=True, tag="close"):
    """The client is leaving; the server frees the session at once."""

    session_id: int


ControlRequest = ResetRequest | CloseRequest


class ControlAck(msgspec.Struct, frozen=True):
    """Positive answer to a control request."""

    session_id: int
    episode_id: int = 0


class Observation(msgspec.Struct, frozen=True):
    """Client -> server data plane: one observation, the request for one chunk.

    ``prefix_model`` / ``prefix_robot`` are the unexecuted rest of the current chunk (RTC
    conditioning); ``inference_delay_steps`` is computed by the client from its own latency
    samples.
    """

    state: Tensor
    images: dict[str, EncodedImage] = {}
    task: str = ""
    inference_delay_steps: int = 0
    prefix_model: Tensor | None = None
    prefix_robot: Tensor | None = None


class ActionChunk(msgspec.Struct, frozen=True):
    """Server -> client data plane: the chunk answering the observation named in the header.

    Durations are measured on the server's monotonic clock; the server never reports instants.
    """

    chunk_model: Tensor
    chunk_robot: Tensor
    queue_wait_ms: float
    inference_ms: float
    superseded: int = 0
    server_load: float = 0.0


class ErrorEvent(msgspec.Struct, frozen=True):
    """Server -> client data plane: the observation named in the header could not be served."""

    code: str
    message: str


class DrainNotice(msgspec.Struct, frozen=True):
    """Server -> client data plane: the server is shutting down; find another replica."""

    reason: str


class TrajectoryRequest(msgspec.Struct, frozen=True):
    """Client -> server: fetch a named trajectory (``name=""`` lists the library)."""

    name: str = ""


class Trajectory(msgspec.Struct, frozen=True):
    """A whole trajectory in one transfer: positions (T, D) at ``fps``."""

    name: str
    joint_names: list[str]
    fps: float
    positions: Tensor


class TrajectoryList(msgspec.Struct, frozen=True):
    """The names of a server's trajectory library."""

    names: list[str]
