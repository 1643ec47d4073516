"""servo's one error tree, and the error plumbing shared by every layer.

Every error servo raises derives from `ServoError`, through the category that says what went
wrong: the client's conversation with a server (`servo.client.ClientError`), configuration
(`servo.config.ConfigError`), trust (`SecurityError`), the wire protocol (`ProtocolError`), the
policy (`PolicyError`), the robot (`RobotError`) or a service that cannot start (`StartError`).
Each error keeps the builtin base it always had (`servo.config.ConfigError` is still a
``ValueError``, `servo.client.RequestTimeout` a ``TimeoutError``), so code that catches the
builtin keeps working.

The classes of the Rust core (`HeaderError`, `AuthError`, `QueueError`) are defined here too and
raised by `servo._core`. This module imports nothing of servo: every layer may import it.
"""

from __future__ import annotations


class ServoError(Exception):
    """Base of every error servo raises: ``except servo.ServoError`` catches them all."""


class SecurityError(ServoError):
    """Something that must be trusted is not: a key, pin, certificate, token or signature."""


class ProtocolError(ServoError):
    """A message from the network that violates servo's protocol (bounds, shapes, encoding)."""


class PolicyError(ServoError):
    """The policy cannot be loaded, failed, or returned what must never reach a robot."""


class RobotError(ServoError):
    """The robot, its cameras, its bus or its description failed or refused a command."""


class StartError(ServoError):
    """A service (edge, router, fleet, replicas) could not start; the message says what to fix."""


class HeaderError(ProtocolError, ValueError):
    """A header could not be built, encoded or decoded (raised by `servo._core`).

    The message names the problem, e.g. ``"attachment is 12 bytes, expected 62"``,
    ``"bad magic b'XX', expected b'SV'"``, ``"unsupported schema_version 2 (supported: 3)"``,
    ``"unknown msg_type 9 (known: 1, 2, 3, 4, 5, 6)"``,
    ``"flags=256 does not fit u8, expected 0 <= flags <= 255"`` or
    ``"session_id is 8 bytes, expected 16"``.
    """


class AuthError(SecurityError, ValueError):
    """A message failed authentication, or a key, cipher or signature input was refused.

    Raised by `servo._core`. The message says which, e.g. ``"tag mismatch"``, ``"zero tag: the message is
    unauthenticated"``, ``"attachment is 61 bytes, expected 62"``, ``"secret is 16 bytes,
    expected 32"``, ``"a client does not send msg_type 2"``, ``"seq_id 5 of msg_type 1 is not
    above the last one sent under this key (its nonce would repeat)"``, ``"peer public key is of
    low order (all-zero shared secret)"`` or ``"this KeyPair was already used (key pairs are
    single-use)"``.
    """


class QueueError(ServoError, ValueError):
    """A chunk was rejected by `servo._core.ActionQueue.merge` (raised by `servo._core`).

    Raised for a wrong dtype, a wrong number of dimensions, a wrong action dimension, an
    ``original``/``processed`` length mismatch, an empty chunk, a merge that would exceed
    the queue's capacity, or a position read before the last merge. The message names the
    expected and the actual values, e.g. ``"processed has shape (50, 7), expected (T, 6)"``.
    The queue is left unchanged.
    """


def first_error(exc: BaseException) -> BaseException:
    """The single error inside (possibly nested) task-group exception groups, else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
