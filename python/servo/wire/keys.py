"""Key expressions of the protocol, all rooted at the verbatim chunk ``@servo``.

A verbatim chunk only matches an identical chunk, so a third party's ``**`` subscriber on a
shared router never sees servo traffic. Every user-supplied segment passes through `segment`,
so nobody can smuggle a wildcard, a separator, a verbatim chunk or a control character into a key.

Layout (``<p>`` = ``@servo/<app>/<model>/<replica>``)::

    <p>/status              queryable   capabilities, load and identity
    <p>/alive               liveliness  the server replica
    <p>/trajectory          queryable   trajectory library
    <p>/audit               queryable   the replica's recent requests (monitors, `servo.wire.audit`)
    <p>/c/<client>/session  queryable   open a session (handshake, capability validation)
    <p>/c/<client>/obs      pub/sub     observations, client -> server
    <p>/c/<client>/action   pub/sub     chunks, errors and drain notices, server -> client
    <p>/c/<client>/control  queryable   reset / close
    <p>/c/<client>/alive    liveliness  the client

Everything a client does lives under its own ``<p>/c/<client>/``, session open included: a
router's access control that gives each robot its own ``c/<name>`` keys (`servo.router.acl`)
therefore also decides who may open a session under which client id. A robot's own status
record for monitors lives outside any replica, under ``@servo/@robots/<client>/telemetry``
(`servo.wire.telemetry`).
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass

from servo.logs import CONTROL_CHARACTERS
from servo.wire.errors import WireError

ROOT = "@servo"
MAX_SEGMENT_LEN = 128
_FORBIDDEN = re.compile(r"[*$?#/\s]")
_SLUG_DROP = re.compile(r"[^A-Za-z0-9._-]+")


def segment(value: str, *, what: str = "key segment") -> str:
    """Validate one user-supplied key segment and return it unchanged.

    Raises:
        WireError: empty, too long, starting with ``@`` (verbatim chunk), or containing any of
            ``* $ ? # /``, whitespace or a control character.
    """
    if not value:
        raise WireError(f"{what} must not be empty")
    if len(value) > MAX_SEGMENT_LEN:
        raise WireError(f"{what} is {len(value)} characters, the limit is {MAX_SEGMENT_LEN}")
    hidden = CONTROL_CHARACTERS.search(value)
    if hidden:
        raise WireError(f"{what} contains the control character {hidden.group()!r}")
    bad = _FORBIDDEN.search(value)
    if bad:
        raise WireError(f"{what} {value!r} contains {bad.group()!r}; * $ ? # / and spaces are not allowed")
    if value.startswith("@"):
        raise WireError(f"{what} {value!r} must not start with '@' (reserved for verbatim chunks)")
    return value


def host_server_id(pid: int) -> str:
    """A server's id on this machine: ``<host>-<pid>`` (its replica id unless the manifest names one)."""
    return f"{slugify(socket.gethostname())}-{pid}"


def on_this_host(server_id: str) -> bool:
    """Whether a server's id (`host_server_id`) says it runs on this machine."""
    host, _, pid = server_id.rpartition("-")
    try:
        return pid.isdigit() and host == slugify(socket.gethostname())
    except WireError:
        return False


def slugify(text: str, *, what: str = "key segment") -> str:
    """Turn free text (a model id such as ``lerobot/pi0``) into a safe key segment.

    Runs of characters outside ``[A-Za-z0-9._-]`` become one ``-``; leading/trailing ``-`` and
    ``.`` are stripped. Raises `WireError` if nothing is left.
    """
    slug = _SLUG_DROP.sub("-", text).strip("-.")[:MAX_SEGMENT_LEN].rstrip("-.")
    if not slug:
        raise WireError(f"{what} {text!r} has no usable characters")
    return slug


@dataclass(frozen=True)
class ClientKeys:
    """Keys of one client of one replica."""

    session: str
    obs: str
    action: str
    control: str
    alive: str


@dataclass(frozen=True)
class ServerKeys:
    """Keys of one server replica, built from already-validated segments."""

    app: str
    model: str
    replica: str

    def __post_init__(self) -> None:
        segment(self.app, what="app")
        segment(self.model, what="model")
        segment(self.replica, what="replica")

    @property
    def prefix(self) -> str:
        """``@servo/<app>/<model>/<replica>``."""
        return f"{ROOT}/{self.app}/{self.model}/{self.replica}"

    @property
    def status(self) -> str:
        """Status queryable."""
        return f"{self.prefix}/status"

    @property
    def alive(self) -> str:
        """The replica's liveliness token."""
        return f"{self.prefix}/alive"

    @property
    def trajectory(self) -> str:
        """Trajectory library queryable."""
        return f"{self.prefix}/trajectory"

    @property
    def audit(self) -> str:
        """The recent-requests queryable monitors ask (`servo.wire.audit`)."""
        return f"{self.prefix}/audit"

    @property
    def all_obs(self) -> str:
        """What the server subscribes to: every client's observations (one level, never ``**``)."""
        return f"{self.prefix}/c/*/obs"

    @property
    def all_sessions(self) -> str:
        """Every client's session-open queryable."""
        return f"{self.prefix}/c/*/session"

    @property
    def all_control(self) -> str:
        """Every client's control queryable."""
        return f"{self.prefix}/c/*/control"

    @property
    def all_client_alive(self) -> str:
        """Every client's liveliness token."""
        return f"{self.prefix}/c/*/alive"

    def client(self, client_id: str) -> ClientKeys:
        """Keys of one client; ``client_id`` is validated."""
        base = f"{self.prefix}/c/{segment(client_id, what='client_id')}"
        return ClientKeys(f"{base}/session", f"{base}/obs", f"{base}/action", f"{base}/control", f"{base}/alive")

    def client_of(self, key: str) -> str:
        """The client id inside one of this replica's per-client keys.

        Raises:
            WireError: the key is not ``<prefix>/c/<client>/<leaf>``.
        """
        head = f"{self.prefix}/c/"
        if not key.startswith(head):
            raise WireError(f"key {key!r} is not under {head}")
        parts = key[len(head) :].split("/")
        if len(parts) != 2:
            raise WireError(f"key {key!r} is not {head}<client>/<leaf>")
        return segment(parts[0], what="client_id")

    @classmethod
    def parse_status(cls, key: str) -> ServerKeys:
        """Recover a replica's keys from the key of its status reply."""
        parts = key.split("/")
        if len(parts) != 5 or parts[0] != ROOT or parts[4] != "status":
            raise WireError(f"key {key!r} is not {ROOT}/<app>/<model>/<replica>/status")
        return cls(parts[1], parts[2], parts[3])


def status_selector(app: str | None = None, model: str | None = None) -> str:
    """Selector matching the status queryable of every replica (optionally of one app/model)."""
    a = "*" if app is None else segment(app, what="app")
    m = "*" if model is None else segment(model, what="model")
    return f"{ROOT}/{a}/{m}/*/status"


def alive_selector(app: str | None = None, model: str | None = None) -> str:
    """Selector matching the liveliness token of every replica (optionally of one app/model)."""
    return status_selector(app, model).removesuffix("status") + "alive"


def audit_selector() -> str:
    """Selector matching the audit queryable of every replica."""
    return status_selector().removesuffix("status") + "audit"
