"""Errors of the client library."""

from __future__ import annotations

from servo.errors import SecurityError, ServoError
from servo.wire import Rejection


class ClientError(ServoError):
    """Base class of client errors."""


class NoServerFound(ClientError):
    """No replica answered the status query (or none matched the selectors)."""


class UntrustedServer(NoServerFound, SecurityError):
    """No replica advertises an identity this client trusts for the deployment (`servo.client.known`).

    The message names the identities seen and trusted, and the command that accepts a new one.
    """


class RogueServer(NoServerFound, SecurityError):
    """A replica's session ack failed verification (forged, or signed by another identity): skipped."""


class SessionRejected(ClientError):
    """The server refused the session; ``rejection.code`` says which rule failed."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(f"{rejection.code}: {rejection.reason}")
        self.rejection = rejection


class RequestTimeout(ClientError, TimeoutError):
    """No chunk answered the request in time."""


class SendFailed(RequestTimeout):
    """The observation never left: no server subscribes to it, or Zenoh refused the put.

    Raised by `RemoteSession.receive` as soon as the client knows, not after the request
    timeout; a `RequestTimeout` to callers that treat both alike.
    """


class ServerError(ClientError):
    """The server answered a request with an error event (bad observation, policy failure)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class SessionLost(ClientError):
    """The server drained or its liveliness token vanished; open a new session."""
