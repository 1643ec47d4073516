"""The async client library: discover servers, open sessions, infer. No torch import."""

from servo.client.errors import (
    ClientError,
    NoServerFound,
    RequestTimeout,
    RogueServer,
    ServerError,
    SessionLost,
    SessionRejected,
)
from servo.client.policy_client import PolicyClient
from servo.client.session import ChunkResult, RemoteSession, ServerInfo
from servo.client.trust import TrustedServers
from servo.client.verify import REJECT_REASONS, ClientStatistics

__all__ = [
    "REJECT_REASONS",
    "ChunkResult",
    "ClientError",
    "ClientStatistics",
    "NoServerFound",
    "PolicyClient",
    "RemoteSession",
    "RequestTimeout",
    "RogueServer",
    "ServerError",
    "ServerInfo",
    "SessionLost",
    "SessionRejected",
    "TrustedServers",
]
