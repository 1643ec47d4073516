"""The client library: discover servers, open sessions, infer. No torch import.

`PolicyClient` is the async building block; `SyncPolicyClient` wraps it for scripts with openpi's
``infer(obs) -> {"actions": ...}``.
"""

from servo.client.discovery import ServerInfo
from servo.client.errors import (
    ClientError,
    NoServerFound,
    RequestTimeout,
    RogueServer,
    SendFailed,
    ServerError,
    SessionLost,
    SessionRejected,
    UntrustedServer,
)
from servo.client.options import ClientOptions, PlacementOptions, SessionOptions
from servo.client.policy_client import PolicyClient
from servo.client.results import ChunkResult
from servo.client.session import RemoteSession
from servo.client.sync import SyncPolicyClient
from servo.client.trust import TrustedServers
from servo.client.verify import REJECT_REASONS, ClientStatistics
from servo.wire import CameraFeature, Features
from servo.wire.openpi import ObservationKeys

__all__ = [
    "REJECT_REASONS",
    "CameraFeature",
    "ChunkResult",
    "ClientError",
    "ClientOptions",
    "ClientStatistics",
    "Features",
    "NoServerFound",
    "ObservationKeys",
    "PlacementOptions",
    "PolicyClient",
    "RemoteSession",
    "RequestTimeout",
    "RogueServer",
    "SendFailed",
    "ServerError",
    "ServerInfo",
    "SessionLost",
    "SessionOptions",
    "SessionRejected",
    "SyncPolicyClient",
    "TrustedServers",
    "UntrustedServer",
]
