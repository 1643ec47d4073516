"""Open, create and replace the files that decide whom a machine trusts, as ssh does its own.

Keys (``robot.key``, ``servers/<app>.key``, ``monitor.key``, the self-signed certificate's key),
pins (``known_servers``, pinned certificates), the server's roster of robots and tokens, and what
guards against replays (the edge's ``telemetry.run``, the monitor's ``monitor.state``) all pass
through here, so one set of rules holds for every one of them:

* **No links.** A file is opened with ``O_NOFOLLOW``: a ``robot.key`` that is a symbolic link
  (to another user's file, say) is refused, not followed.
* **Ours alone.** A file must be a regular file owned by the current user; a secret must be
  readable by nobody else (mode ``0600``), a pin writable by nobody else. Its directory must be
  owned by the current user (or root) and writable by nobody else: whoever may write the
  directory may swap the file.
* **Written whole, in place.** A replacement is written to a new temporary file in the same
  directory, created with ``O_EXCL | O_NOFOLLOW`` (an existing file or link under that name is
  never opened, let alone truncated), flushed, and renamed over the target: a reader sees the
  old file or the new one. A new secret is linked into place instead, so an existing one is
  never overwritten.

Every refusal is a `PrivateFileError` whose one line names the file and the fix
(``chmod 600 …``, ``chown …``, "remove the link"). Only POSIX semantics are checked; on a system
without ownership (Windows) the checks that need it are skipped.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from servo.errors import SecurityError

__all__ = [
    "PrivateFileError",
    "check_dir",
    "create_private",
    "private_dir",
    "private_opener",
    "read_private",
    "update_private",
    "write_private",
]

#: The largest file read here (keys, pins and rosters are a few kB).
MAX_BYTES = 4 * 1024 * 1024
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# A FIFO planted under a key's name must not hang the reader.
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class PrivateFileError(SecurityError, ValueError):
    """A key, pin or roster file (or its directory) cannot be trusted; the message says what to fix."""


def _euid() -> int | None:
    return os.geteuid() if hasattr(os, "geteuid") else None


def _check_owner(path: Path, info: os.stat_result, what: str, *, root_ok: bool) -> None:
    me = _euid()
    if me is None or info.st_uid == me or (root_ok and info.st_uid == 0):
        return
    raise PrivateFileError(
        f"{path}: {what} is owned by user {info.st_uid}, not by this user ({me}); "
        f"use a {what} of your own (or chown it)"
    )


def check_dir(path: Path, what: str = "directory") -> None:
    """Refuse a directory that is not one, someone else's, or writable by others.

    Raises:
        FileNotFoundError: it does not exist.
        PrivateFileError: it cannot be trusted.
    """
    try:
        info = path.stat()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise PrivateFileError(f"{path}: cannot use this {what}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise PrivateFileError(f"{path}: the {what} is not a directory")
    _check_owner(path, info, what, root_ok=True)
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PrivateFileError(
            f"{path}: the {what} is writable by others (mode {stat.S_IMODE(info.st_mode):04o}), who could swap "
            f"its files; chmod go-w {path}"
        )


def private_dir(path: Path, what: str = "servo directory") -> Path:
    """``path``, created with mode 0700 (and its missing parents too) when missing, then checked (`check_dir`).

    Raises:
        PrivateFileError: it cannot be created or used.
    """
    try:
        for missing in reversed([path, *path.parents]):
            if not missing.exists():
                missing.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise PrivateFileError(f"{path}: cannot create the {what}: {exc.strerror or exc}") from None
    try:
        check_dir(path, what)
    except FileNotFoundError:  # removed meanwhile
        raise PrivateFileError(f"{path}: the {what} vanished while it was made") from None
    return path


def read_private(path: str | Path, *, what: str, secret: bool) -> bytes:
    """The bytes of ``path``, opened without following a link and checked (module docstring).

    Args:
        path: The file.
        what: What it is, for messages (``identity key``, ``known servers``).
        secret: Refuse it readable by others (a key); otherwise refuse it writable by others (a pin).

    Raises:
        FileNotFoundError: it does not exist (the caller may create it).
        PrivateFileError: anything else that makes it untrustworthy or unreadable.
    """
    path = Path(path)
    check_dir(path.parent)
    fd = _open_nofollow(path, what)
    with os.fdopen(fd, "rb") as file:
        _check_file(path, os.fstat(fd), what, secret=secret)
        return _read_bounded(path, file, what)


def _open_nofollow(path: Path, what: str) -> int:
    """A read-only descriptor of ``path``, never through a link (`read_private`'s rules)."""
    try:
        return os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PrivateFileError(
                f"{path}: {what} is a symbolic link; servo never follows one here (remove it)"
            ) from None
        raise PrivateFileError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None


def _check_file(path: Path, info: os.stat_result, what: str, *, secret: bool) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise PrivateFileError(f"{path}: the {what} is not a regular file")
    _check_owner(path, info, what, root_ok=False)
    mode = stat.S_IMODE(info.st_mode)
    if secret and mode & 0o077:
        raise PrivateFileError(f"{path}: {what} is accessible by others (mode {mode:04o}); chmod 600 it")
    if not secret and mode & 0o022:
        raise PrivateFileError(
            f"{path}: {what} is writable by others (mode {mode:04o}); chmod 600 it (they would choose whom "
            "this machine trusts)"
        )


def _read_bounded(path: Path, file: BinaryIO, what: str) -> bytes:
    data = file.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise PrivateFileError(f"{path}: the {what} is larger than {MAX_BYTES} bytes")
    return data


def _writable_dir(path: Path, what: str) -> None:
    try:
        check_dir(path.parent)
    except FileNotFoundError:
        raise PrivateFileError(f"{path}: cannot create the {what}: its directory does not exist") from None


def _staging(path: Path) -> tuple[Path, int]:
    """A new private file beside ``path`` (never an existing file or link), open for writing."""
    while True:
        staging = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}")
        try:
            return staging, os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
        except FileExistsError:
            continue


def _put(path: Path, data: bytes, *, what: str, place: Callable[[Path, Path], None], verb: str) -> None:
    """Write ``data`` to a new temporary file beside ``path``, flush it, and ``place`` it at ``path``."""
    _writable_dir(path, what)
    staging, fd = _staging(path)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        place(staging, path)
    except FileExistsError:
        raise
    except OSError as exc:
        raise PrivateFileError(f"{path}: cannot {verb} the {what}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            staging.unlink()


def write_private(path: str | Path, data: bytes, *, what: str) -> None:
    """Replace ``path`` with ``data`` (mode 0600), atomically, through a new temporary file beside it.

    A link at ``path`` is replaced, never followed.

    Raises:
        PrivateFileError: the directory is untrustworthy, or the file cannot be written.
    """
    _put(Path(path), data, what=what, place=os.replace, verb="write")


def create_private(path: str | Path, data: bytes, *, what: str) -> bool:
    """Create ``path`` holding ``data`` (mode 0600) unless it exists; False when it did.

    The file appears complete or not at all, and an existing file (or link) is never touched.

    Raises:
        PrivateFileError: the directory is untrustworthy, or the file cannot be created.
    """
    try:
        _put(Path(path), data, what=what, place=os.link, verb="create")
    except FileExistsError:
        return False
    return True


def update_private(path: str | Path, change: Callable[[bytes], bytes], *, what: str) -> bytes:
    """Replace ``path`` by ``change(its bytes)`` (``b""`` when missing) under a lock; the new bytes.

    For a file several processes of this user read and rewrite (a counter): the file is read and
    checked as `read_private` reads a pin, locked (``flock``) so no two updates interleave, and
    replaced as `write_private` replaces one, so a crash leaves the old bytes or the new, whole.
    An update that waited for the lock of a file replaced meanwhile starts again on the new one.

    Raises:
        PrivateFileError: the file or its directory cannot be trusted, read or written.
    """
    import fcntl  # POSIX: the rest of this module runs where it is missing

    path = Path(path)
    while True:
        _writable_dir(path, what)
        try:
            fd = _open_nofollow(path, what)
        except FileNotFoundError:
            create_private(path, b"", what=what)
            continue
        with os.fdopen(fd, "rb") as file:
            info = os.fstat(fd)
            _check_file(path, info, what, secret=False)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                current = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if (current.st_dev, current.st_ino) != (info.st_dev, info.st_ino):
                continue
            data = change(_read_bounded(path, file, what))
            write_private(path, data, what=what)
            return data


def private_opener(path: str, flags: int) -> int:
    """An ``opener`` for `open` that creates the file readable by this user alone (mode ``0600``).

    For the files servo writes as it goes where the operator chose: a robot's recordings (its
    camera frames) and the server's audit log (every robot's requests). An existing file keeps
    the mode it has: whoever made it chose.
    """
    return os.open(path, flags | _CLOEXEC, 0o600)
