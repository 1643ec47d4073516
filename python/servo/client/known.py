"""Trust on first use: the servers a machine met, written down like SSH's ``known_hosts``.

A client given no pins (``trusted_servers``) trusts the identity it first sees for a deployment
and writes it down in ``known_servers`` in the user's servo directory (`servo.home`), one line
per identity::

    # servo known servers: <app>/<model> <identity> (written on first contact; edit freely)
    */* ed25519:3q2-7wJ4…
    kitchen/pi0 ed25519:bm9pc2U…

The deployment is the selector the client discovers with (``--app``/``--model``, ``*`` for
unspecified); the file is written mode 0600 and refused when others may write it (they would
choose the servers). From then on only replicas advertising a written-down identity are used (and
their acks must be signed by it: `servo.client.trust`); one that advertises another is refused
loudly, with both fingerprints and the command that accepts it (`accept_command`). If first
contact sees several identities for the deployment, nothing is trusted: the client refuses,
listing them, since it cannot tell the server from an impostor. Replicas of one deployment
share an identity (`servo.home`: one per app per server machine) or are all listed.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from servo.client.errors import UntrustedServer
from servo.home import known_servers_path
from servo.wire import WireError, fingerprint, parse_fingerprint

_HEADER = "# servo known servers: <app>/<model> <identity> (written on first contact; edit freely)\n"


def deployment(app: str | None, model: str | None) -> str:
    """The selector a client discovers with, as known_servers keys it: ``app/model``, ``*`` for any."""
    return f"{app or '*'}/{model or '*'}"


def accept_command(selector: str, identities: Iterable[bytes]) -> str:
    """The ``servo-edge trust`` command that makes ``identities`` the trusted ones for ``selector``."""
    app, _, model = selector.partition("/")
    flags = "".join(f" --{name} {value}" for name, value in (("app", app), ("model", model)) if value != "*")
    return f"servo-edge trust{flags} " + " ".join(fingerprint(identity) for identity in sorted(identities))


class KnownServers:
    """The known-servers file. Read and written by the event loop that owns the client (small file).

    Args:
        path: The file; ``known_servers`` in the user's servo directory when omitted.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else known_servers_path()

    def entries(self) -> list[tuple[str, bytes]]:
        """Every ``(selector, identity)`` line, in file order.

        Raises:
            UntrustedServer: a line is malformed (named with its number): nothing is trusted then.
        """
        try:
            with self.path.open("rb") as file:
                mode = os.fstat(file.fileno()).st_mode
                text = file.read().decode("utf-8")
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError) as exc:
            raise UntrustedServer(f"{self.path}: cannot read the known servers: {exc}") from None
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            # Whoever may write the file chooses which servers this robot obeys.
            raise UntrustedServer(
                f"{self.path}: the known servers are writable by others (mode {stat.S_IMODE(mode):04o}); chmod 600 it"
            )
        out = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            selector, _, identity = line.strip().partition(" ")
            try:
                out.append((selector, parse_fingerprint(identity.strip())))
            except WireError as exc:
                raise UntrustedServer(f"{self.path} line {number}: {exc}") from None
        return out

    def identities(self, selector: str) -> frozenset[bytes]:
        """The identities trusted for ``selector`` (empty: never met)."""
        return frozenset(identity for known, identity in self.entries() if known == selector)

    def replace(self, selector: str, identities: Iterable[bytes]) -> None:
        """Trust exactly ``identities`` for ``selector`` from now on (the other lines are kept).

        Raises:
            OSError: the file cannot be written.
        """
        keep = [(known, identity) for known, identity in self.entries() if known != selector]
        lines = [f"{known} {fingerprint(identity)}\n" for known, identity in keep]
        lines += [f"{selector} {fingerprint(identity)}\n" for identity in sorted(set(identities))]
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            with os.fdopen(
                os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8"
            ) as file:
                file.write(_HEADER + "".join(lines))
            os.replace(temporary, self.path)  # atomic: a reader sees the old file or the new one
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
