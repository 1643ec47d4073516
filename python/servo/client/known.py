"""Trust on first use: the servers a machine met, written down like SSH's ``known_hosts``.

A client given no pins (``trusted_servers``) trusts the identity it first sees for a deployment
and writes it down in ``known_servers`` in the user's servo directory (`servo.home`), one line
per identity::

    # servo known servers: <app>/<model> <identity> (written on first contact; edit freely)
    */* ed25519:3q2-7wJ4…
    kitchen/pi0 ed25519:bm9pc2U…

The deployment is the selector the client discovers with (``--app``/``--model``, ``*`` for
unspecified); the file is written mode 0600 and refused when others may write it (they would
choose the servers), when it is a symbolic link or another user's, or when its directory is
writable by others (`servo.private_files`). From then on only replicas advertising a written-down identity are used (and
their acks must be signed by it: `servo.client.trust`); one that advertises another is refused
loudly, with both fingerprints and the command that accepts it (`accept_command`). If first
contact sees several identities for the deployment, nothing is trusted: the client refuses,
listing them, since it cannot tell the server from an impostor. Replicas of one deployment
share an identity (`servo.home`: one per app per server machine) or are all listed.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from servo.client.errors import UntrustedServer
from servo.home import known_servers_path
from servo.private_files import PrivateFileError, private_dir, read_private, write_private
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
            # Whoever may write the file chooses which servers this robot obeys.
            text = read_private(self.path, what="known servers", secret=False).decode("utf-8")
        except FileNotFoundError:
            return []
        except PrivateFileError as exc:
            raise UntrustedServer(str(exc)) from None
        except UnicodeDecodeError as exc:
            raise UntrustedServer(f"{self.path}: cannot read the known servers: {exc}") from None
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
            UntrustedServer: the file (or its directory) cannot be trusted or written.
        """
        keep = [(known, identity) for known, identity in self.entries() if known != selector]
        lines = [f"{known} {fingerprint(identity)}\n" for known, identity in keep]
        lines += [f"{selector} {fingerprint(identity)}\n" for identity in sorted(set(identities))]
        try:
            private_dir(self.path.parent)
            write_private(self.path, (_HEADER + "".join(lines)).encode(), what="known servers")
        except PrivateFileError as exc:
            raise UntrustedServer(str(exc)) from None
