"""What a process exposes: its listening sockets, and the Zenoh declarations of the sessions it opens.

Declarations are recorded where every Zenoh session is opened (`servo.transport.open_zsession`
calls ``zenoh.open``): while a `Census` is installed, ``zenoh.open`` hands out the real session
wrapped so that each ``declare_*`` (and each liveliness token or subscriber) is written down with
the component that opened the session (a context variable the test sets around each component's
start; AnyIO carries it into the worker thread that opens the session, and the session remembers
it for declarations made later from any thread). Nothing else about the session changes: the
wrapper forwards every call.

Sockets come from the operating system (psutil: this process's listening TCP sockets and bound
UDP sockets), not from servo's own account of them; files from the directories themselves.
"""

from __future__ import annotations

import contextlib
import contextvars
import fnmatch
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import zenoh

from servo.threat_model import DOORS, Door

component: contextvars.ContextVar[str] = contextvars.ContextVar("component", default="unknown")


@dataclass(frozen=True)
class Declaration:
    """One declaration: who made it, what kind, on which key expression."""

    component: str
    kind: str
    key: str


class Census:
    """The declarations recorded so far (written by whichever thread declares, read by the test)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.declarations: set[Declaration] = set()

    def add(self, owner: str, kind: str, key: object) -> None:
        with self._lock:
            self.declarations.add(Declaration(owner, kind, str(key)))

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Record the declarations of every Zenoh session opened from now on (until the test ends)."""
        real_open = zenoh.open

        def recording_open(config: zenoh.Config) -> Any:
            return _Session(real_open(config), self)

        monkeypatch.setattr(zenoh, "open", recording_open)

    def unmatched(self) -> list[Declaration]:
        """Declarations no row of the threat model names (same component, same kind, key within its expression)."""
        return [d for d in sorted(self.declarations, key=str) if door_of(d) is None]


def door_of(declaration: Declaration) -> Door | None:
    """The threat model's row for a declaration, if any."""
    for door in DOORS:
        if door.component != declaration.component or door.kind != declaration.kind:
            continue
        if zenoh.KeyExpr(door.where).includes(zenoh.KeyExpr(declaration.key)):
            return door
    return None


class _Liveliness:
    def __init__(self, liveliness: Any, record: Any) -> None:
        self._liveliness, self._record = liveliness, record

    def declare_token(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        self._record("liveliness token", key)
        return self._liveliness.declare_token(key, *args, **kwargs)

    def declare_subscriber(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        self._record("liveliness subscriber", key)
        return self._liveliness.declare_subscriber(key, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._liveliness, name)


class _Session:
    """A Zenoh session that reports its declarations (everything else forwarded)."""

    def __init__(self, session: zenoh.Session, census: Census) -> None:
        self._session, self._census, self._owner = session, census, component.get()

    def _record(self, kind: str, key: object) -> None:
        self._census.add(self._owner, kind, key)

    def declare_subscriber(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        self._record("subscriber", key)
        return self._session.declare_subscriber(key, *args, **kwargs)

    def declare_queryable(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        self._record("queryable", key)
        return self._session.declare_queryable(key, *args, **kwargs)

    def declare_publisher(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        self._record("publisher", key)
        return self._session.declare_publisher(key, *args, **kwargs)

    def liveliness(self) -> _Liveliness:
        return _Liveliness(self._session.liveliness(), self._record)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


@contextmanager
def as_component(name: str) -> Iterator[None]:
    """Attribute the sessions opened inside the block (and the tasks started there) to ``name``."""
    token = component.set(name)
    try:
        yield
    finally:
        component.reset(token)


def listening_ports() -> set[tuple[int, str]]:
    """This process's listening TCP ports and bound UDP ports: ``(port, "tcp" or "udp")``."""
    out: set[tuple[int, str]] = set()
    for conn in psutil.Process().net_connections(kind="inet"):
        if conn.type == 1 and conn.status == psutil.CONN_LISTEN:  # SOCK_STREAM
            out.add((conn.laddr.port, "tcp"))
        elif conn.type == 2 and conn.laddr:  # SOCK_DGRAM bound
            out.add((conn.laddr.port, "udp"))
    return out


def unix_sockets(pid: int) -> list[tuple[str, bool]]:
    """The Unix sockets process ``pid`` holds: ``(path, listening)``, path "" for an anonymous one."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if (target := os.readlink(fd)).startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    out = []
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[6] in inodes:
            listening = int(fields[3], 16) & 0x10000 != 0  # __SO_ACCEPTCON
            out.append((fields[7] if len(fields) > 7 else "", listening))
    return out


def kept_files(directory: Path) -> dict[str, Path]:
    """Every entry under ``directory`` but directories (links included), by its path relative to it."""
    return {str(p.relative_to(directory)): p for p in directory.rglob("*") if p.is_symlink() or not p.is_dir()}


def file_row(relative: str) -> Door | None:
    """The threat model's row for a file of servo's directory (``<…>`` in a row is one path segment)."""
    parts = relative.split("/")
    for door in DOORS:
        pattern = [re.sub(r"<[^>]+>", "*", part) for part in door.where.split("/")]
        same_depth = door.kind == "file" and len(pattern) == len(parts)
        if same_depth and all(fnmatch.fnmatchcase(part, glob) for part, glob in zip(parts, pattern, strict=True)):
            return door
    return None
