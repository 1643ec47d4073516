"""Ed25519 identities kept in files: a server's, a robot's and an operator's.

A server's signs its session acks, trajectories and notices; a robot's signs its session opens
and its telemetry; an operator's (a monitor's) signs its audit queries and reads the telemetry
robots encrypt to it.
All three are the same thing, `Identity` (the Rust core's generic Ed25519 key, `servo._core.ServerIdentity`),
stored the same way: a file holding the secret seed, one line ``servo-identity-v1 <urlsafe base64
of the 32-byte seed>``. A missing file is created with mode 0600 (atomically: never overwritten,
never readable by others, even for a moment) and its fingerprint is logged; processes sharing a
file share the identity. A file readable by group or others, a symbolic link, a file of another
user or one in a directory others may write is refused (`servo.private_files`), as ssh refuses
such a private key.

Where they live by default is `servo.home`'s business: ``robot.key``, ``monitor.key`` and
``servers/<app>.key`` in the user's servo directory. This module sits beside `servo.home`, below
every layer that uses it (server, client, edge, cli), and imports nothing above `servo.wire`.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from servo._core import SEED_SIZE
from servo._core import ServerIdentity as Identity
from servo.errors import SecurityError
from servo.home import ensure_config_dir, operator_identity_path, robot_identity_path, server_identity_path
from servo.logs import get_logger
from servo.private_files import PrivateFileError, create_private, private_dir, read_private
from servo.wire import fingerprint

log = get_logger(__name__)

__all__ = [
    "Identity",
    "IdentityError",
    "ephemeral_identity",
    "load_identity",
    "operator_identity",
    "robot_identity",
    "server_identity",
]

_TAG = "servo-identity-v1"


class IdentityError(SecurityError, ValueError):
    """The identity file cannot be used; the message names the file and the problem."""


def load_identity(path: str | Path, *, role: str = "server") -> Identity:
    """The identity stored at ``path``, created there when missing (its directory must exist).

    Args:
        path: The identity file.
        role: What the identity is for (``server``, ``robot``), named in the log line.

    Raises:
        IdentityError: unreadable, readable by others, not an identity file, or not creatable.
    """
    path = Path(path)
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    identity = Identity.generate()
    text = f"{_TAG} {base64.urlsafe_b64encode(identity.seed).decode()}\n"
    try:
        created = create_private(path, text.encode(), what="identity key")
    except PrivateFileError as exc:
        raise IdentityError(str(exc)) from None
    if not created:  # another process created it meanwhile: use theirs
        return _read(path)
    log.info("identity created", role=role, path=str(path), fingerprint=fingerprint(identity.public_key))
    return identity


def ephemeral_identity(role: str = "server") -> Identity:
    """A new identity kept nowhere (an explicit choice: nobody can pin or enrol it)."""
    identity = Identity.generate()
    log.info("ephemeral identity", role=role, fingerprint=fingerprint(identity.public_key))
    return identity


def robot_identity(path: str | Path = "") -> Identity:
    """This robot's identity: ``path``, else ``robot.key`` in the user's servo directory.

    Raises:
        IdentityError: see `load_identity` (and the servo directory cannot be created).
    """
    return load_identity(path or _in_config_dir(robot_identity_path()), role="robot")


def operator_identity(path: str | Path = "") -> Identity:
    """This machine's operator (monitor) identity: ``path``, else ``monitor.key`` in the user's servo directory.

    Raises:
        IdentityError: see `load_identity` (and the servo directory cannot be created).
    """
    return load_identity(path or _in_config_dir(operator_identity_path()), role="operator")


def server_identity(path: str | Path, app: str) -> Identity:
    """A server's identity: ``path``, else ``servers/<app>.key`` in the user's servo directory.

    Raises:
        IdentityError: see `load_identity` (and the servo directory cannot be created).
    """
    return load_identity(path or _in_config_dir(server_identity_path(app)), role="server")


def _in_config_dir(path: Path) -> Path:
    try:
        ensure_config_dir()
        private_dir(path.parent)
    except PrivateFileError as exc:
        raise IdentityError(str(exc)) from None
    return path


def _read(path: Path) -> Identity:
    try:
        text = read_private(path, what="identity key", secret=True).decode("ascii")
    except FileNotFoundError:
        raise
    except PrivateFileError as exc:
        raise IdentityError(str(exc)) from None
    except UnicodeDecodeError:
        text = ""
    tag, _, encoded = text.strip().partition(" ")
    try:
        seed = base64.urlsafe_b64decode(encoded) if tag == _TAG else b""
    except (binascii.Error, ValueError):
        seed = b""
    if len(seed) != SEED_SIZE:
        raise IdentityError(
            f"{path}: not a servo identity key (expected one line '{_TAG} <base64 of {SEED_SIZE} bytes>')"
        )
    return Identity.from_seed(seed)
