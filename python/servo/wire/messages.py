"""Every message body of the protocol (msgpack via msgspec), schema 2.

Evolution is additive: new fields get defaults, unknown fields are ignored on decode, and a
layout change of an existing field needs a new schema version (negotiated at session open).
Correlation (seq_id, episode, epoch, the client's monotonic stamp, the session id) travels in the
attachment header (`servo._core.Header`), never in these bodies. No field carries a wall-clock
instant.

Everything a peer controls is bounded here, where it is decoded: string lengths, list and dict
sizes, key sizes. A message that breaks a bound fails to decode (`servo.wire.decode` raises
`WireError` naming the field), so no consumer ever sees it. Session ids are 16 random bytes on
the wire (`SESSION_ID_SIZE`) and their 32-character hex text everywhere in Python.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, TypeVar

import msgspec

from servo import _core
from servo.config import NonNegativeFloat, NonNegativeInt, PositiveInt
from servo.wire.image import EncodedImage
from servo.wire.tensor import Tensor

# One schema version covers the attachment header and these bodies.
SUPPORTED_SCHEMA_VERSIONS: tuple[int, ...] = tuple(sorted(_core.SUPPORTED_SCHEMA_VERSIONS))

#: Longest client id, feature name, camera name or tag key (characters).
MAX_NAME_CHARS = 128
#: Longest task instruction (characters).
MAX_TASK_CHARS = 1024
#: Most state or action names of a robot or policy.
MAX_FEATURES = 256
#: Most cameras of a robot or policy.
MAX_CAMERAS = 16
#: Most operators a session ack names (the readers of a robot's telemetry).
MAX_OPERATORS = 8
#: Most tags of a session open, and the longest tag value (characters).
MAX_TAGS = 32
MAX_TAG_CHARS = 256

T = TypeVar("T")

Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME_CHARS)]
Task = Annotated[str, msgspec.Meta(max_length=MAX_TASK_CHARS)]
SessionId = Annotated[bytes, msgspec.Meta(min_length=_core.SESSION_ID_SIZE, max_length=_core.SESSION_ID_SIZE)]
PublicKey = Annotated[bytes, msgspec.Meta(min_length=_core.PUBLIC_KEY_SIZE, max_length=_core.PUBLIC_KEY_SIZE)]
Signature = Annotated[bytes, msgspec.Meta(min_length=_core.SIGNATURE_SIZE, max_length=_core.SIGNATURE_SIZE)]
#: A signature where older peers send none (empty); whoever checks it refuses the empty one.
OptionalSignature = Annotated[bytes, msgspec.Meta(max_length=_core.SIGNATURE_SIZE)]
#: A public key where older peers send none (empty); whoever checks it refuses the empty one.
OptionalPublicKey = Annotated[bytes, msgspec.Meta(max_length=_core.PUBLIC_KEY_SIZE)]
#: A random value that makes a signed answer fresh (`NONCE_SIZE` bytes when set).
Nonce = Annotated[bytes, msgspec.Meta(max_length=32)]
#: A join token's id (`servo.join`): lowercase base32, or empty.
JoinId = Annotated[str, msgspec.Meta(max_length=16, pattern="^[a-z2-7]*$")]
#: Bytes of the nonces servo draws.
NONCE_SIZE = 16
Pixels = Annotated[int, msgspec.Meta(ge=1, le=65_535)]
Fps = Annotated[float, msgspec.Meta(gt=0.0, le=100_000.0)]
#: The schema versions a client offers at open (the server reads them before the rest of the open).
SchemaVersions = Annotated[list[int], msgspec.Meta(max_length=16)]
#: State, action or unit names of a robot or policy.
FeatureNames = Annotated[list[Name], msgspec.Meta(max_length=MAX_FEATURES)]
#: Anything keyed by camera name.
ByCamera = Annotated[dict[Name, T], msgspec.Meta(max_length=MAX_CAMERAS)]
#: A reconnect's proof that it held its previous session (an attachment header and its tag, at most).
Resume = Annotated[bytes, msgspec.Meta(max_length=_core.ATTACHMENT_SIZE)]
#: A 32-bit counter of the attachment header (episode, session epoch).
U32 = Annotated[int, msgspec.Meta(ge=0, le=0xFFFF_FFFF)]
Tags = Annotated[dict[Name, Annotated[str, msgspec.Meta(max_length=MAX_TAG_CHARS)]], msgspec.Meta(max_length=MAX_TAGS)]


class CameraFeature(msgspec.Struct, frozen=True):
    """Shape of one camera stream (RGB)."""

    height: Pixels
    width: Pixels


class Features(msgspec.Struct, frozen=True):
    """The feature contract between a robot and a policy.

    ``action_names`` order is the sync-safety contract: column i of every chunk drives the motor
    named ``action_names[i]``. ``state_units`` / ``action_units`` name the unit of each value
    (LeRobot's motor normalisation modes: ``degrees``, ``range_m100_100``, ``range_0_100``; any
    other name is compared verbatim); an empty list, or an empty entry, means "not declared".
    """

    state_names: FeatureNames
    action_names: FeatureNames
    cameras: ByCamera[CameraFeature]
    state_units: FeatureNames = []
    action_units: FeatureNames = []


class Tuning(msgspec.Struct, frozen=True):
    """The policy's own options that fix a chunk too short for its forward, as its configuration names them.

    What every "chunks too short" advice names (the server's capacity plan, the edge's warning):
    ``chunk`` sets the chunk length (``chunk_size``; a Diffusion policy's ``n_action_steps``),
    at most ``chunk_max`` with the rest of the configuration as it is (0: no bound known; then
    ``chunk_max_why`` says what bounds it); ``faster`` are options that make a forward cheaper,
    each with its value now (``num_inference_steps = 100``).
    """

    chunk: Name = "chunk_size"
    chunk_max: NonNegativeInt = 0
    chunk_max_why: Name = ""
    faster: Annotated[list[Name], msgspec.Meta(max_length=8)] = []

    def longer_chunk(self, needed: int) -> str:
        """The fix on the chunk's side: ``a longer chunk (n_action_steps >= 36; at most 15 here: …)``."""
        bound = ""
        if self.chunk_max and needed > self.chunk_max:
            bound = f"; at most {self.chunk_max} here: {self.chunk_max_why}" if self.chunk_max_why else ""
        return f"a longer chunk ({self.chunk} >= {needed}{bound})"

    def faster_forward(self) -> str:
        """The fix on the forward's side, naming the policy's own options when it has some."""
        options = f"lower {', '.join(self.faster)}, " if self.faster else ""
        gpu = "a GPU: servo-serve --device cuda"
        return f"a faster forward ({options}{gpu}, fewer or lower-resolution cameras, a smaller model)"


class PolicyInfo(msgspec.Struct, frozen=True):
    """What a server serves, as reported by status and session ack."""

    model: str
    revision: str
    features: Features
    chunk_size: PositiveInt
    fps: Fps
    supports_rtc: bool
    chunk_stateless: bool
    serving_mode: Literal["shared", "exclusive"]
    default_task: str = ""
    pin_task: bool = False
    strict_fps: bool = False
    tuning: Tuning = Tuning()


#: The largest status reply decoded: anyone on the link answers status queries, so a peer's reply
#: is bounded before it is decoded (a real one, features and all, is a few kB).
MAX_STATUS_BYTES = 1024 * 1024


class StatusReply(msgspec.Struct, frozen=True):
    """Answer of the status queryable; one per replica.

    ``identity`` is the replica's Ed25519 public key (`servo._core.ServerIdentity`): the key its
    session acks are signed with, and what an edge pins. The advertised load is validated on
    decode (finite, >= 0; 0 <= active_sessions <= max_sessions): a replica cannot win discovery
    with ``load = -1`` or NaN.
    """

    server_id: str
    app: str
    model_key: str
    replica: str
    schema_versions: list[int]
    policy: PolicyInfo
    warmed_up: bool
    draining: bool
    active_sessions: NonNegativeInt
    max_sessions: PositiveInt
    load: NonNegativeFloat
    identity: PublicKey
    #: Median wait of the replica's recent observations before inference (ms); placement uses it.
    queue_wait_ms: NonNegativeFloat = 0.0
    #: Median forward time of the replica's recent requests (ms; 0 before the first): an edge
    #: tells at session open whether the policy's chunks can outlast its round trips.
    inference_ms: NonNegativeFloat = 0.0
    #: What a session open must carry (and sign) now: a robot's open is fresh only with a nonce
    #: the replica handed out in the last minute, so a captured open cannot be replayed.
    nonce: Nonce = b""

    def __post_init__(self) -> None:
        """Refuse an impossible load (msgspec turns the ValueError into a decode error)."""
        if not math.isfinite(self.load):
            raise ValueError(f"load {self.load} is not finite")
        for name in ("queue_wait_ms", "inference_ms"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} {getattr(self, name)} is not finite")
        if self.active_sessions > self.max_sessions:
            raise ValueError(f"active_sessions {self.active_sessions} exceeds max_sessions {self.max_sessions}")


class SessionOpen(msgspec.Struct, frozen=True):
    """Client -> server: the handshake. Bind this client to the replica and validate capabilities.

    Sent on the client's own ``…/c/<client_id>/session`` key; the server requires ``client_id``
    to name that key. ``client_key`` is the client's ephemeral X25519 public key (the session
    key is derived from it, never sent). ``resume`` proves the client holds the key of its
    current session on this replica, so the new session may replace it: the old key's proof
    (`servo._core.SessionKey.authenticate`) over `servo.wire.trust.resume_body` of ``client_key``, or empty.
    ``join_id`` and ``join_signature`` prove a join token (`servo.join`): the signature, by the
    token's key, over `servo.wire.trust.join_transcript`, enrols a robot nobody enrolled yet.
    """

    client_id: Name
    schema_versions: SchemaVersions
    features: Features
    fps: Fps
    client_key: PublicKey
    task: Task = ""
    rtc: bool = False
    session_epoch: U32 = 0
    tags: Tags = {}
    resume: Resume = b""
    robot_key: OptionalPublicKey = b""
    nonce: Nonce = b""
    robot_signature: OptionalSignature = b""
    join_id: JoinId = ""
    join_signature: OptionalSignature = b""


class SessionAck(msgspec.Struct, frozen=True):
    """Server -> client: the session exists; ``rtc`` is what will actually be applied.

    ``server_key`` is the server's ephemeral X25519 public key; ``signature`` is the replica's
    Ed25519 signature (by ``server_identity``) over `servo.wire.trust.ack_transcript`, which
    binds both public keys, the session id and the replica: an edge that verifies it knows the
    session key it derives is shared with that identity and nobody else.
    """

    session_id: SessionId
    schema_version: int
    server_id: str
    replica: str
    policy: PolicyInfo
    rtc: bool
    task: str
    server_key: PublicKey
    server_identity: PublicKey
    signature: Signature
    warnings: list[str] = []
    #: Cameras the client may send shrunk to the policy's input size (`servo.wire.downsize`)
    #: instead of the size it declared: the server shrinks larger frames to it anyway.
    input_sizes: Annotated[dict[Name, CameraFeature], msgspec.Meta(max_length=MAX_CAMERAS)] = {}
    #: The Ed25519 keys of the replica's operators (under the signature): the robot encrypts its
    #: telemetry to them (`servo.wire.telemetry`).
    operators: Annotated[list[PublicKey], msgspec.Meta(max_length=MAX_OPERATORS)] = []


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
    "session_exists",
    "unauthenticated",
    "rate_limited",
    "stale_nonce",
]


class Rejection(msgspec.Struct, frozen=True):
    """Why a control request was refused; sent as a Zenoh error reply.

    A refused trajectory fetch is signed by the replica (``signature`` over
    `servo.wire.trust.rejection_transcript`): a robot obeys no refusal it cannot verify.
    """

    code: RejectCode
    reason: str
    active_sessions: int = 0
    max_sessions: int = 0
    load: float = 0.0
    signature: OptionalSignature = b""


class ResetRequest(msgspec.Struct, frozen=True, tag="reset"):
    """Episode boundary: the server drops the session's pending observation and processor state.

    Like every control request, sent encrypted with the session key (msg_type
    CONTROL); ``session_id`` must be the one of that attachment.
    """

    session_id: SessionId
    episode_id: U32


class CloseRequest(msgspec.Struct, frozen=True, tag="close"):
    """The client is leaving; the server frees the session at once."""

    session_id: SessionId


ControlRequest = ResetRequest | CloseRequest


class ControlAck(msgspec.Struct, frozen=True):
    """Positive answer to a control request, encrypted with the session key (msg_type CONTROL_ACK)."""

    session_id: SessionId
    episode_id: int = 0


class Observation(msgspec.Struct, frozen=True):
    """Client -> server data plane: one observation, the request for one chunk.

    ``prefix_model`` / ``prefix_robot`` are the unexecuted rest of the current chunk (RTC
    conditioning); ``inference_delay_steps`` is computed by the client from its own latency
    samples.
    """

    state: Tensor
    images: ByCamera[EncodedImage] = {}
    task: Task = ""
    inference_delay_steps: int = 0
    prefix_model: Tensor | None = None
    prefix_robot: Tensor | None = None


class ActionChunk(msgspec.Struct, frozen=True):
    """Server -> client data plane: the chunk answering the observation named in the header.

    ``chunk_robot`` (robot space) always ships; ``chunk_model`` (model space, the RTC prefix of
    the next request) only when it differs, so an identity post-processing ships one tensor and
    the edge uses ``chunk_robot`` for both. Durations are measured on the server's monotonic
    clock; the server never reports instants.
    """

    chunk_robot: Tensor
    queue_wait_ms: float
    inference_ms: float
    superseded: int = 0
    server_load: float = 0.0
    chunk_model: Tensor | None = None


class ErrorEvent(msgspec.Struct, frozen=True):
    """Server -> client data plane: the observation named in the header could not be served.

    Sealed with the session key like every message of a session, except the ``unknown_session``
    notice of a replica that holds no key for the session: that one carries the replica's
    ``signature`` over `servo.wire.trust.notice_transcript` instead.
    """

    code: str
    message: str
    signature: OptionalSignature = b""


class DrainNotice(msgspec.Struct, frozen=True):
    """Server -> client data plane: the server is shutting down; find another replica."""

    reason: str


#: Every message body of the session protocol (`servo.wire.MESSAGE_TYPES` adds trajectories, telemetry and audit).
SESSION_MESSAGE_TYPES: tuple[type[msgspec.Struct], ...] = (
    StatusReply,
    SessionOpen,
    SessionAck,
    Rejection,
    ResetRequest,
    CloseRequest,
    ControlAck,
    Observation,
    ActionChunk,
    ErrorEvent,
    DrainNotice,
)
