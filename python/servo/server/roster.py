"""The roster file: robots enrolled by join tokens, the tokens, and the openpi API keys.

One JSON file per app in the server's servo directory (``servers/<app>.roster``, `servo.home`),
or the file ``[security] roster`` names. ``servo-serve`` and ``servo-serve robots …`` both change
it, never by hand: every change is a read-modify-write under an exclusive lock (``<file>.lock``,
``flock``) written through `servo.private_files` (a new temporary file, renamed over it), so a
running server and the command line never lose each other's changes, and a reader sees a whole
file. The server notices a change by its ``stat`` (`Roster.stamp`) and reads it again.

What it holds, and never holds:

* ``robots``: name, identity fingerprint, the token it joined with, when.
* ``tokens``: id, the *verifier* (the public half of the key the token's secret seeds:
  `servo.join`), expiry, uses left, an optional robot name it is for, who used it, revoked.
  Never the secret. Spent and expired tokens are kept `RETAIN_S` past their expiry, so a second
  use is refused saying why (used, expired, revoked), then forgotten.
* ``api_keys``: id, holder, SHA-256 of the key, expiry. Never the key.
* ``server``: what the last server started with it advertised (identity, certificate pin, listen
  endpoints), so ``servo-serve robots token`` can print a complete command.

Times are this machine's wall clock (Unix seconds): they never leave it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import msgspec

from servo.errors import SecurityError
from servo.private_files import PrivateFileError, check_dir, private_dir, read_private, write_private

__all__ = [
    "RETAIN_S",
    "Advertised",
    "Roster",
    "RosterApiKey",
    "RosterError",
    "RosterFile",
    "RosterRobot",
    "RosterToken",
]

#: How long a spent, expired or revoked token is remembered past its expiry (s).
RETAIN_S = 24 * 3600.0
_WHAT = "roster"
T = TypeVar("T")


class RosterError(SecurityError, ValueError):
    """The roster file cannot be used; the message names the file and the problem."""


class RosterRobot(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A robot enrolled by a join token (or by ``servo-serve robots``)."""

    name: str
    identity: str
    token: str = ""
    joined: float = 0.0


class RosterToken(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A join token as the server keeps it (no secret: see the module docstring)."""

    id: str
    verifier: str
    expires: float
    uses: int
    name: str = ""
    created: float = 0.0
    revoked: bool = False
    used_by: list[str] = []

    def problem(self, now: float) -> str | None:
        """Why this token cannot be used now, one clause naming the token; None when it can."""
        if self.revoked:
            return f"join token {self.id} was revoked"
        if self.uses <= 0:
            by = f" (by {', '.join(repr(n) for n in self.used_by)})" if self.used_by else ""
            return f"join token {self.id} was used already{by}"
        if now >= self.expires:
            return f"join token {self.id} expired {_ago(now - self.expires)} ago"
        return None


class RosterApiKey(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An openpi API key as the server keeps it: the SHA-256 of the key, hex."""

    id: str
    name: str
    digest: str
    created: float = 0.0
    expires: float = 0.0


class Advertised(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the last server started with this roster told robots to trust and dial."""

    identity: str
    certificate: str = ""
    listen: list[str] = []


class RosterFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The whole file."""

    version: int = 1
    robots: list[RosterRobot] = []
    tokens: list[RosterToken] = []
    api_keys: list[RosterApiKey] = []
    server: Advertised | None = None

    def token(self, token_id: str) -> RosterToken | None:
        """The token named ``token_id``, if kept."""
        return next((t for t in self.tokens if t.id == token_id), None)

    def robot(self, name: str) -> RosterRobot | None:
        """The robot enrolled as ``name``, if any."""
        return next((r for r in self.robots if r.name == name), None)

    def pruned(self, now: float) -> RosterFile:
        """Without the tokens and API keys past their expiry by more than `RETAIN_S`."""
        tokens = [t for t in self.tokens if t.expires + RETAIN_S > now]
        keys = [k for k in self.api_keys if not k.expires or k.expires + RETAIN_S > now]
        return msgspec.structs.replace(self, tokens=tokens, api_keys=keys)


class Roster:
    """The roster file at ``path``; every method does file I/O (call it off the event loop).

    Args:
        path: The file (it need not exist: missing reads as empty).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def read(self) -> RosterFile:
        """The file's contents (empty when missing).

        Raises:
            RosterError: untrustworthy (`servo.private_files`), unreadable or malformed.
        """
        try:
            data = read_private(self.path, what=_WHAT, secret=False)
        except FileNotFoundError:
            return RosterFile()
        except PrivateFileError as exc:
            raise RosterError(str(exc)) from None
        try:
            return msgspec.json.decode(data, type=RosterFile)
        except msgspec.DecodeError as exc:
            raise RosterError(f"{self.path}: not a servo roster ({exc}); servo-serve robots manages it") from None

    def stamp(self) -> tuple[int, int, int] | None:
        """What changes whenever the file is replaced (inode, mtime, size); None when missing."""
        try:
            info = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RosterError(f"{self.path}: cannot read the roster: {exc.strerror or exc}") from None
        return info.st_ino, info.st_mtime_ns, info.st_size

    def change(self, edit: Callable[[RosterFile], tuple[RosterFile, T]]) -> T:
        """Apply ``edit`` to the file under the lock and write the result; what ``edit`` returned.

        ``edit`` gets the current contents (pruned of long-expired entries) and returns the new
        ones and a value; the file is rewritten only when the contents changed.

        Raises:
            RosterError: the directory or file cannot be trusted, read or written.
        """
        try:
            private_dir(self.path.parent, "roster directory")
        except PrivateFileError as exc:
            raise RosterError(str(exc)) from None
        with self._locked():
            before = self.read()
            after, result = edit(before.pruned(time.time()))
            if after != before:
                try:
                    write_private(self.path, msgspec.json.format(msgspec.json.encode(after)) + b"\n", what=_WHAT)
                except PrivateFileError as exc:
                    raise RosterError(str(exc)) from None
            return result

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            import fcntl
        except ImportError:  # not a POSIX system: one writer at a time is the operator's business
            yield
            return
        lock = self.path.with_name(self.path.name + ".lock")
        try:
            check_dir(lock.parent)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC, 0o600)
        except (OSError, PrivateFileError) as exc:
            raise RosterError(f"{lock}: cannot lock the roster: {getattr(exc, 'strerror', None) or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
