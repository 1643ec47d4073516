"""The async client library: discover servers, open sessions, infer. No torch import."""

from servo.client.errors import (
    ClientError,
    NoServerFound,
    RequestTimeout,
    ServerError,
    SessionLost,
    SessionRejected,
)
from servo.client.policy_client import PolicyClient, ServerInfo
from servo.client.session import ChunkResult, ObservationInput, RemoteSession

__all__ = [
    "ChunkResult",
    "ClientError",
    "NoServerFound",
    "ObservationInput",
    "PolicyClient",
    "RemoteSession",
    "RequestTimeout",
    "ServerError",
    "ServerInfo",
    "SessionLost",
    "SessionRejected",
]
