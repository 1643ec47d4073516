"""The wire protocol: message bodies, tensor and image codecs, key expressions."""

from servo.wire.codec import MAX_MESSAGE_BYTES, decode, encode
from servo.wire.errors import WireError
from servo.wire.header import reply_header
from servo.wire.image import EncodedImage, check_frame, decode_image, encode_image
from servo.wire.keys import ROOT, ClientKeys, ServerKeys, segment, slugify, status_selector
from servo.wire.messages import (
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
from servo.wire.tensor import Tensor, decode_tensor, encode_tensor

__all__ = [
    "MAX_MESSAGE_BYTES",
    "ROOT",
    "SUPPORTED_SCHEMA_VERSIONS",
    "ActionChunk",
    "CameraFeature",
    "ClientKeys",
    "CloseRequest",
    "ControlAck",
    "ControlRequest",
    "DrainNotice",
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
    "StatusReply",
    "Tensor",
    "Trajectory",
    "TrajectoryList",
    "TrajectoryRequest",
    "WireError",
    "check_frame",
    "decode",
    "decode_image",
    "decode_tensor",
    "encode",
    "encode_image",
    "encode_tensor",
    "reply_header",
    "segment",
    "slugify",
    "status_selector",
]
