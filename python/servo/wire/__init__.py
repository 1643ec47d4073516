"""The wire protocol: message bodies, tensor and image codecs, key expressions."""

import msgspec

from servo.wire.audit import AuditEntry, AuditQuery, AuditTail
from servo.wire.codec import MAX_MESSAGE_BYTES, decode, encode
from servo.wire.errors import WireError
from servo.wire.header import reply_header
from servo.wire.image import EncodedImage, check_frame, decode_image, downsize, encode_image, jpeg_dimensions
from servo.wire.keys import (
    ROOT,
    ClientKeys,
    ServerKeys,
    alive_selector,
    audit_selector,
    segment,
    slugify,
    status_selector,
)
from servo.wire.messages import (
    SESSION_MESSAGE_TYPES,
    SUPPORTED_SCHEMA_VERSIONS,
    ActionChunk,
    CameraFeature,
    CloseRequest,
    ControlAck,
    ControlRequest,
    DrainNotice,
    ErrorEvent,
    Features,
    Observation,
    PolicyInfo,
    Rejection,
    ResetRequest,
    SessionAck,
    SessionOpen,
    StatusReply,
    Trajectory,
    TrajectoryList,
    TrajectoryRequest,
)
from servo.wire.telemetry import (
    TELEMETRY_SELECTOR,
    EdgeTelemetry,
    Signer,
    Transition,
    open_telemetry,
    seal_telemetry,
    telemetry_key,
)
from servo.wire.tensor import Tensor, decode_floats, decode_tensor, encode_tensor
from servo.wire.trust import ack_transcript, fingerprint, parse_fingerprint, resume_body

#: Every message body of the protocol, for codec tests and fuzzing.
MESSAGE_TYPES: tuple[type[msgspec.Struct], ...] = (*SESSION_MESSAGE_TYPES, EdgeTelemetry, AuditQuery, AuditTail)

__all__ = [
    "MAX_MESSAGE_BYTES",
    "MESSAGE_TYPES",
    "ROOT",
    "SUPPORTED_SCHEMA_VERSIONS",
    "TELEMETRY_SELECTOR",
    "ActionChunk",
    "AuditEntry",
    "AuditQuery",
    "AuditTail",
    "CameraFeature",
    "ClientKeys",
    "CloseRequest",
    "ControlAck",
    "ControlRequest",
    "DrainNotice",
    "EdgeTelemetry",
    "EncodedImage",
    "ErrorEvent",
    "Features",
    "Observation",
    "PolicyInfo",
    "Rejection",
    "ResetRequest",
    "ServerKeys",
    "SessionAck",
    "SessionOpen",
    "Signer",
    "StatusReply",
    "Tensor",
    "Trajectory",
    "TrajectoryList",
    "TrajectoryRequest",
    "Transition",
    "WireError",
    "ack_transcript",
    "alive_selector",
    "audit_selector",
    "check_frame",
    "decode",
    "decode_floats",
    "decode_image",
    "decode_tensor",
    "downsize",
    "encode",
    "encode_image",
    "encode_tensor",
    "fingerprint",
    "jpeg_dimensions",
    "open_telemetry",
    "parse_fingerprint",
    "reply_header",
    "resume_body",
    "seal_telemetry",
    "segment",
    "slugify",
    "status_selector",
    "telemetry_key",
]
