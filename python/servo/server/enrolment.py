"""Who a replica is, whom it knows, and who may come in: read once, at start, off the loop.

Its identity, the robots and the operators the manifest's ``[security]`` (and its fleet file)
name (`servo.server.manifest_security.SecuritySection`); then its doors (`open_doors`): the admission rule
(`servo.access`) with those operators, closed to robots nobody enrolled when the server is
reachable off loopback (`servo.server.exposure.reachable_off_loopback`) or the manifest enrols
robots, unless ``allow_any_robot``; the roster of robots that joined with tokens
(`servo.server.joins`); and, when the door is closed, a fresh join token to print.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from servo.access import Access, AccessRules
from servo.config import ConfigError
from servo.home import roster_path
from servo.identity import Identity, ephemeral_identity, server_identity
from servo.join import JoinToken
from servo.router.fleet import identities, robot_identities
from servo.server.exposure import reachable_off_loopback
from servo.server.joins import JoinDesk, advertise, issue
from servo.server.manifest import Manifest
from servo.server.manifest_security import SecuritySection
from servo.server.roster import Advertised, Roster, RosterError
from servo.transport import ZenohSettings
from servo.wire import fingerprint, parse_fingerprint
from servo.wire.messages import MAX_OPERATORS


@dataclass(frozen=True)
class Doors:
    """Who may come in, as decided at start (`open_doors`).

    Args:
        access: The admission rule every door asks.
        joins: The roster and its join tokens.
        join_token: The token printed at start (None: the door is open, or none was asked for).
    """

    access: Access
    joins: JoinDesk
    join_token: JoinToken | None = None

    @property
    def closed(self) -> bool:
        """Whether only enrolled robots may open sessions."""
        return not self.access.rules.any_robot


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


def certificate_pin(zenoh: ZenohSettings) -> bytes:
    """What a join token pins of the TLS listen certificate: its key's hash if self-signed, else nothing.

    A robot can only use a self-signed certificate itself as its trust anchor; a fleet CA's
    certificates are trusted through the CA (``--tls-root-ca``).
    """
    tls = zenoh.tls
    if tls is None or not tls.listen_certificate or not any(e.startswith("tls/") for e in zenoh.listen):
        return b""
    from cryptography import x509

    from servo.server.selfsigned import public_key_pin

    pem = Path(tls.listen_certificate).read_bytes()
    cert = x509.load_pem_x509_certificate(pem)
    return public_key_pin(pem) if cert.issuer == cert.subject else b""


def open_doors(manifest: Manifest, identity: Identity, static: dict[str, bytes]) -> Doors:
    """The doors of a replica of ``manifest`` with ``identity`` (module docstring); off the event loop.

    Args:
        manifest: The manifest.
        identity: The replica's identity (the join token pins it).
        static: The robots the manifest and its fleet file enrol (`enrolled_robots`).

    Raises:
        ConfigError: the roster or the operators cannot be used (named).
    """
    security = manifest.security
    closed = not security.allow_any_robot and (reachable_off_loopback(manifest.zenoh) or bool(static))
    access = Access(AccessRules(server=identity.public_key, any_robot=not closed, operators=operators(security)))
    roster = Roster(security.roster or roster_path(manifest.serving.app))
    joins = JoinDesk(roster, access, static)
    token = None
    try:
        joins.read()
        if closed and security.join_token_ttl_s > 0:
            pin = certificate_pin(manifest.zenoh)
            advertised = Advertised(fingerprint(identity.public_key), pin.hex(), manifest.zenoh.listen_endpoints())
            roster.change(lambda f: advertise(f, advertised))
            token = roster.change(
                lambda f: issue(
                    f,
                    JoinToken.issue(identity.public_key, pin),
                    ttl_s=security.join_token_ttl_s,
                    uses=security.join_token_uses,
                    now=time.time(),
                )
            )
            joins.read()
    except RosterError as exc:
        raise ConfigError(f"security.roster: {exc}") from None
    return Doors(access, joins, token)
