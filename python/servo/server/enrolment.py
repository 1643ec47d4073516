"""Who a replica is and whom it knows: its identity, its enrolled robots and its operators.

All come from the manifest's ``[security]`` (`servo.server.manifest.SecuritySection`) and its
fleet file, read once, at start, off the event loop.
"""

from __future__ import annotations

from servo.config import ConfigError
from servo.identity import Identity, ephemeral_identity, server_identity
from servo.router.fleet import identities, robot_identities
from servo.server.manifest import SecuritySection
from servo.wire import parse_fingerprint
from servo.wire.messages import MAX_OPERATORS


def replica_identity(security: SecuritySection, app: str) -> Identity:
    """The identity ``[security]`` asks for.

    ``identity_key``, else ``servers/<app>.key`` in servo's directory (`servo.home`), so replicas
    started from one directory share it; a new one kept nowhere with ``ephemeral_identity``.

    Raises:
        IdentityError: the file cannot be read or created.
    """
    if security.ephemeral_identity:
        return ephemeral_identity()
    return server_identity(security.identity_key, app)


def enrolled_robots(security: SecuritySection) -> dict[str, bytes]:
    """The robots ``[security] robots`` and the ``[[robots]]`` of its ``fleet`` file enrol, name to key.

    Raises:
        ConfigError: the fleet file is unusable, or it and the manifest enrol one name with two
            identities (or one identity under two names).
    """
    enrolled = {robot.name: parse_fingerprint(robot.identity) for robot in security.robots}
    if not security.fleet:
        return enrolled
    for name, key in robot_identities(security.fleet).items():
        if enrolled.get(name, key) != key:
            raise ConfigError(f"security.fleet: {name!r} has another identity in {security.fleet} than in robots")
        enrolled[name] = key
    holders: dict[bytes, str] = {}
    for name, key in enrolled.items():
        if holders.setdefault(key, name) != name:
            raise ConfigError(f"security: {holders[key]!r} and {name!r} are enrolled with one identity")
    return enrolled


def operators(security: SecuritySection) -> dict[str, bytes]:
    """The operators ``[security] operators`` and the ``[[monitors]]`` of its ``fleet`` file name, name to key.

    Raises:
        ConfigError: the fleet file is unusable, or it names an operator with another identity.
    """
    named = {operator.name: parse_fingerprint(operator.identity) for operator in security.operators}
    for name, key in (identities(security.fleet, "monitors") if security.fleet else {}).items():
        if named.get(name, key) != key:
            raise ConfigError(f"security.fleet: {name!r} has another identity in {security.fleet} than in operators")
        named[name] = key
    if len(named) > MAX_OPERATORS:
        raise ConfigError(
            f"security: {len(named)} operators (operators and the fleet's monitors); at most {MAX_OPERATORS}: "
            "each robot encrypts every telemetry record to each of them"
        )
    return named
