"""The client library: discover servers, open sessions, infer. No torch import.

`PolicyClient` is the async building block; `SyncPolicyClient` wraps it for scripts with openpi's
``infer(obs) -> {"actions": ...}``.
"""

from servo.client.errors import (
    ClientError,
    NoServerFound,
    RequestTimeout,
    ServerError,
    SessionLost,
    SessionRejected,
)
from servo.client.policy_client import PolicyClient
from servo.client.session import ChunkResult, RemoteSession, ServerInfo
from servo.client.sync import SyncPolicyClient
from servo.wire import CameraFeature, Features
from servo.wire.openpi import ObservationKeys

__all__ = [
    "CameraFeature",
    "ChunkResult",
    "ClientError",
    "Features",
    "NoServerFound",
    "ObservationKeys",
    "PolicyClient",
    "RemoteSession",
    "RequestTimeout",
    "ServerError",
    "ServerInfo",
    "SessionLost",
    "SessionRejected",
    "SyncPolicyClient",
]
