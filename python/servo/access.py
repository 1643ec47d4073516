"""Who is asking, and what they may see: the one admission rule every door of a server calls.

A server has several doors: Zenoh session opens, the openpi WebSocket door, and the status,
audit and telemetry a fleet reads. Each asks the same `Access` object who the caller is, and gets
a `Caller` or a `Denied` with a one-line reason. There are four kinds of caller:

* ``robot``: an Ed25519 key that signs its session opens, enrolled under a name (the manifest's
  ``[security] robots``, a fleet file's ``[[robots]]``, or a join token: `servo.join`). Nobody
  else may use an enrolled name. A key nobody enrolled is a robot too when the door is *open*:
  ``AccessRules.any_robot``, true on a loopback-only server that enrols nobody (the quick start)
  or with ``--allow-any-robot``; such a caller has ``enrolled = False``.
* ``operator``: an Ed25519 key of a monitor or an operator, named in ``AccessRules.operators``
  (they see the whole fleet).
* ``openpi``: a client of the openpi door presenting an API key (``Authorization: Api-Key …``,
  what ``openpi_client.WebsocketClientPolicy(api_key=…)`` sends). Keys are stored as SHA-256
  hashes (`servo.server.roster`), compared in constant time; a key may expire.
* ``server``: the replica's own identity (its frontends open sessions with it).

What a caller may see: `Caller.may_see` — a robot, or an openpi client, only what concerns its
own name; operators and the server the whole fleet.

Thread-safety: `AccessRules` is immutable; `Access.update` swaps the whole snapshot (one
reference assignment), so a reader on any thread sees the old rules or the new ones, never half.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from servo.wire import fingerprint

__all__ = ["API_KEY_PREFIX", "Access", "AccessRules", "ApiKey", "Caller", "Denied", "hash_api_key", "split_api_key"]

Kind = Literal["robot", "operator", "openpi", "server"]
#: The first field of every openpi API key: ``servo-api-v1.<id>.<secret>``.
API_KEY_PREFIX = "servo-api-v1"
_AUTH_SCHEME = "Api-Key "


@dataclass(frozen=True)
class Caller:
    """Who is asking (immutable).

    Args:
        kind: See the module docstring.
        name: The robot's name (client id), the operator's, or the API key's holder.
        key: The Ed25519 public key that proved it (robots, operators, the server); an API
            key's id as bytes for openpi clients.
        enrolled: False for a robot let in only because the door is open (nobody vouched for it).
    """

    kind: Kind
    name: str
    key: bytes
    enrolled: bool = True

    def may_see(self, robot: str) -> bool:
        """Whether this caller may read the records (audit rows, status, telemetry) of ``robot``."""
        return self.kind in ("operator", "server") or self.name == robot


@dataclass(frozen=True)
class Denied:
    """Why a caller was refused: one line, safe to send back to it."""

    reason: str


@dataclass(frozen=True)
class ApiKey:
    """An openpi API key as the server keeps it: its holder, the SHA-256 of its secret, its expiry.

    Args:
        name: Who holds it (the openpi client's name in logs, audit and metrics).
        digest: SHA-256 of the whole key text (`hash_api_key`).
        expires: Unix time after which it is refused; 0: never.
    """

    name: str
    digest: bytes
    expires: float = 0.0


@dataclass(frozen=True)
class AccessRules:
    """Who may come in (an immutable snapshot; see `Access`).

    Args:
        server: The replica's own Ed25519 public key.
        any_robot: Whether a robot nobody enrolled may open sessions (an open door).
        robots: Enrolled robots, name to Ed25519 public key.
        operators: Operators and monitors, name to Ed25519 public key.
        api_keys: openpi API keys by id.
    """

    server: bytes
    any_robot: bool = False
    robots: Mapping[str, bytes] = field(default_factory=dict)
    operators: Mapping[str, bytes] = field(default_factory=dict)
    api_keys: Mapping[str, ApiKey] = field(default_factory=dict)


def split_api_key(text: str) -> str | None:
    """The id of an API key ``servo-api-v1.<id>.<secret>``, or None when ``text`` is not one."""
    parts = text.split(".")
    if len(parts) != 3 or parts[0] != API_KEY_PREFIX or not parts[1] or not parts[2]:
        return None
    return parts[1]


def hash_api_key(text: str) -> bytes:
    """What the server stores of an API key (the key is 128 random bits: a plain hash suffices)."""
    return hashlib.sha256(text.encode()).digest()


class Access:
    """The admission rule (module docstring). Read from any thread; `update` on the event loop.

    Args:
        rules: The rules to start with.
    """

    def __init__(self, rules: AccessRules) -> None:
        self._rules = rules

    @property
    def rules(self) -> AccessRules:
        """The rules now."""
        return self._rules

    def update(self, **changes: Any) -> None:
        """Replace some rules (e.g. ``robots=…`` after the roster changed), all at once."""
        self._rules = replace(self._rules, **changes)

    def robot(self, name: str, key: bytes) -> Caller | Denied:
        """A robot (or this server) signing as ``key`` under ``name``."""
        rules = self._rules
        if key == rules.server:
            return Caller("server", name, key)
        enrolled = rules.robots.get(name)
        if enrolled is not None:
            if hmac.compare_digest(enrolled, key):
                return Caller("robot", name, key)
            return Denied(
                f"robot {name!r} is enrolled as {fingerprint(enrolled)}; this open is signed by {fingerprint(key)}"
            )
        if rules.any_robot:
            return Caller("robot", name, key, enrolled=False)
        return Denied(
            f"robot {name!r} ({fingerprint(key)}) is not enrolled on this server; join with the token "
            "servo-serve prints (servo-edge --join), or enrol it in [security] robots or the fleet file"
        )

    def operator(self, key: bytes) -> Caller | Denied:
        """An operator or monitor proving ``key`` (a signature the door checked)."""
        rules = self._rules
        if key == rules.server:
            return Caller("server", "server", key)
        for name, known in rules.operators.items():
            if hmac.compare_digest(known, key):
                return Caller("operator", name, key)
        return Denied(f"{fingerprint(key)} is no operator of this server")

    def api_key(self, authorization: str | None, *, now: float | None = None) -> Caller | Denied:
        """An openpi client presenting the ``Authorization`` header ``authorization`` (None: absent)."""
        if not authorization:
            return Denied("an API key is required (Authorization: Api-Key …; openpi: WebsocketClientPolicy(api_key=…))")
        if not authorization.startswith(_AUTH_SCHEME):
            return Denied("the Authorization header is not 'Api-Key <key>'")
        text = authorization[len(_AUTH_SCHEME) :].strip()
        key_id = split_api_key(text)
        stored = None if key_id is None else self._rules.api_keys.get(key_id)
        if key_id is None or stored is None or not hmac.compare_digest(stored.digest, hash_api_key(text)):
            return Denied("the API key is not one of this server's (servo-serve robots api-key NAME makes one)")
        if stored.expires and (time.time() if now is None else now) >= stored.expires:
            return Denied(f"the API key of {stored.name!r} has expired")
        return Caller("openpi", stored.name, key_id.encode())
