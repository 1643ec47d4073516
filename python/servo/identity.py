"""The replica's Ed25519 identity: where it is kept and how it is created.

``[security] identity_key`` in the manifest names a file holding the identity's secret seed, one
line ``servo-identity-v1 <urlsafe base64 of the 32-byte seed>``. A missing file is created with
mode 0600 (atomically: never overwritten, never readable by others, even for a moment) and its
fingerprint is logged; replicas of one model may share one file. A file readable by group or
others is refused, as ssh refuses such a private key. Without ``identity_key`` the server makes an
ephemeral identity at every start: sessions are still authenticated, but an edge cannot pin it.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from pathlib import Path

from servo._core import SEED_SIZE, ServerIdentity
from servo.logs import get_logger
from servo.wire import fingerprint

log = get_logger(__name__)

_TAG = "servo-identity-v1"


class IdentityError(ValueError):
    """The identity file cannot be used; the message names the file and the problem."""


def load_identity(path: str | Path | None) -> ServerIdentity:
    """The identity stored at ``path``, created there when missing; ephemeral when ``path`` is empty.

    Raises:
        IdentityError: unreadable, readable by others, or not an identity file.
    """
    if not path:
        identity = ServerIdentity.generate()
        log.info("ephemeral server identity (set [security] identity_key to keep one)", fingerprint=_fp(identity))
        return identity
    path = Path(path)
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    identity = ServerIdentity.generate()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another replica created it meanwhile: use theirs
        return _read(path)
    except OSError as exc:
        raise IdentityError(f"{path}: cannot create the identity key: {exc.strerror or exc}") from None
    with os.fdopen(fd, "w") as f:
        f.write(f"{_TAG} {base64.urlsafe_b64encode(identity.seed).decode()}\n")
    log.info("server identity created", path=str(path), fingerprint=_fp(identity))
    return identity


def _read(path: Path) -> ServerIdentity:
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise IdentityError(
                f"{path}: identity key is accessible by others (mode {stat.S_IMODE(mode):04o}); chmod 600 it"
            )
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        raise IdentityError(f"{path}: cannot read the identity key: {getattr(exc, 'strerror', None) or exc}") from None
    tag, _, encoded = text.strip().partition(" ")
    try:
        seed = base64.urlsafe_b64decode(encoded) if tag == _TAG else b""
    except (binascii.Error, ValueError):
        seed = b""
    if len(seed) != SEED_SIZE:
        raise IdentityError(
            f"{path}: not a servo identity key (expected one line '{_TAG} <base64 of {SEED_SIZE} bytes>')"
        )
    return ServerIdentity.from_seed(seed)


def _fp(identity: ServerIdentity) -> str:
    return fingerprint(identity.public_key)
