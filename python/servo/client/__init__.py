"""The async client library: discover servers, open sessions, infer. No torch import."""

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

__all__ = [
    "ChunkResult",
    "ClientError",
    "NoServerFound",
    "PolicyClient",
    "RemoteSession",
    "RequestTimeout",
    "ServerError",
    "ServerInfo",
    "SessionLost",
    "SessionRejected",
]
