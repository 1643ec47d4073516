"""The fleet file: who may join a servo router, and in which role.

A fleet file is TOML, converted with `servo.config` (one line naming the key for every mistake)::

    [router]
    listen = ["tls/0.0.0.0:7447"]
    [router.tls]
    certificate = "certs/router.pem"
    private_key = "certs/router.key"
    root_ca = "certs/ca.pem"            # mtls = true by default: members are certificate CNs

    [[servers]]
    names = ["gpu-0"]
    [[robots]]
    names = ["robot-7", "robot-8"]      # a robot's name is its client id
    identities = {robot-7 = "ed25519:…"}  # optional: servers enrol them (servo-edge --identity)
    [[monitors]]
    names = ["dashboard"]
    identities = {dashboard = "ed25519:…"}  # optional: servers' operators (servo-monitor --identity)

``[[servers]]`` may name identities too (``servo-serve`` prints its fingerprint): monitors reading
the fleet file then trust those replicas' status and audit answers.

Members are identified either by the common name of their client certificate (mTLS) or by a user
name checked against a passwords file (``name:password`` lines, the format zenohd reads); secrets
never appear in the fleet file. Relative paths are relative to the fleet file, so a fleet directory
(fleet file, passwords, certificates) works from any working directory; `load_fleet` returns them
resolved.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from servo.config import ConfigError, LeaseMs, NonEmptyStr, convert, doc, load_toml, parse_toml, quoted
from servo.wire import WireError, parse_fingerprint, segment

#: The link protocols a router listens on: identities need ``tls`` (certificates) or any link with
#: a password; other protocols were not verified with access control.
Endpoint = Annotated[
    str,
    doc("A Zenoh endpoint such as tls/0.0.0.0:7447 or tcp/127.0.0.1:7447.", pattern=r"^(tcp|tls)/\S+:[0-9]+$"),
]
Name = Annotated[
    NonEmptyStr,
    doc("A certificate common name (mTLS) or a user name of the passwords file.", max_length=128),
]
Names = Annotated[list[Name], doc("The members of this group.", min_length=1)]
Scope = Annotated[list[str], doc('Key segments this group may serve; "*" for any.', min_length=1)]
Kind = Literal["cert_common_names", "usernames"]


class RouterTls(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[router.tls]``: the router's certificate and the CA of the fleet."""

    certificate: Annotated[NonEmptyStr, doc("PEM certificate of the router; its SAN names the address dialled.")]
    private_key: Annotated[NonEmptyStr, doc("PEM private key of the router certificate.")]
    root_ca: Annotated[str | None, doc("PEM CA that signed every member certificate (and other routers').")] = None
    mtls: Annotated[bool, doc("Require a client certificate; members are then named by its common name.")] = True


class RouterSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[router]``: where the router listens and which routers it joins."""

    listen: Annotated[list[Endpoint], doc("Endpoints the router listens on.", min_length=1)]
    connect: Annotated[list[Endpoint], doc("Other routers to join (a router mesh).")] = []
    lease_ms: Annotated[LeaseMs, doc("Lease announced to members (how fast a dead router shows).", le=600000)] = 1000
    tls: RouterTls | None = None
    passwords_file: Annotated[str | None, doc("File of name:password lines; members are then named by user name.")] = (
        None
    )


class Members(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[[routers]]``: identities sharing one role."""

    names: Names


class RobotGroup(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[[robots]]``: robots; with ``identities``, servers that read the fleet file enrol them."""

    names: Names
    identities: Annotated[
        dict[Name, str],
        msgspec.Meta(
            description="Name -> the robot's Ed25519 fingerprint (servo-edge --identity): servers whose "
            "[security] fleet names this file admit only these robots, each under its own name; monitors "
            "trust their telemetry."
        ),
    ] = {}


class ServerGroup(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[[servers]]``: policy servers, optionally limited to some apps and models."""

    names: Names
    identities: Annotated[
        dict[Name, str],
        msgspec.Meta(
            description="Name -> the server identity's Ed25519 fingerprint (printed by servo-serve): monitors "
            "reading this file believe status and audit answers signed by these identities only."
        ),
    ] = {}
    apps: Scope = msgspec.field(default_factory=lambda: ["*"])
    models: Scope = msgspec.field(default_factory=lambda: ["*"])


class MonitorGroup(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[[monitors]]``: read-only observers (status, liveliness; optionally the data streams)."""

    names: Names
    identities: Annotated[
        dict[Name, str],
        msgspec.Meta(
            description="Name -> the monitor's Ed25519 fingerprint (servo-monitor --identity): servers whose "
            "[security] fleet names this file let it read the fleet's audit trail; robots encrypt their "
            "telemetry to it."
        ),
    ] = {}
    data: Annotated[bool, doc("Also subscribe to observations and action chunks.")] = False


class Fleet(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The whole fleet file; paths are absolute once returned by `load_fleet`.

    Immutable (like every section above), so any thread may read it.
    """

    router: RouterSection
    servers: list[ServerGroup] = []
    robots: list[RobotGroup] = []
    monitors: list[MonitorGroup] = []
    routers: list[Members] = []

    @property
    def identified_by(self) -> Kind:
        """The ACL subject property naming members: certificate common names or user names."""
        tls = self.router.tls
        return "cert_common_names" if tls is not None and tls.mtls else "usernames"

    def count(self, role: Literal["servers", "robots", "monitors", "routers"]) -> int:
        """How many identities hold ``role``."""
        groups: list[ServerGroup] | list[RobotGroup] | list[Members] | list[MonitorGroup] = getattr(self, role)
        return sum(len(group.names) for group in groups)


def parse_fleet(text: str | bytes, *, origin: str, base_dir: Path) -> Fleet:
    """Decode and check a fleet file; relative paths are resolved against ``base_dir``.

    Raises:
        ConfigError: invalid TOML, an unknown or missing key, a bad value, a duplicate identity,
            a missing file, or settings that cannot work together; the message names the key.
    """
    return _checked(parse_toml(text, Fleet, origin=origin), origin, base_dir)


def load_fleet(path: str | Path) -> Fleet:
    """Read and check a fleet file (see `parse_fleet`).

    Raises:
        ConfigError: the file cannot be read or is refused.
    """
    return _checked(load_toml(path, Fleet), str(path), Path(path).resolve().parent)


class _Identities(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The part of a fleet file a policy server or a monitor reads (the rest is the router's)."""

    robots: list[RobotGroup] = []
    servers: list[ServerGroup] = []
    monitors: list[MonitorGroup] = []


Role = Literal["robots", "servers", "monitors"]


def robot_identities(path: str | Path) -> dict[str, bytes]:
    """The robots a fleet file gives identities to, name -> Ed25519 public key (see `identities`)."""
    return identities(path, "robots")


def identities(path: str | Path, role: Role) -> dict[str, bytes]:
    """The members of ``role`` a fleet file gives identities to, name -> Ed25519 public key.

    Servers and monitors read only these groups (they need not hold the router's certificates);
    the identities are checked as `load_fleet` checks them.

    Raises:
        ConfigError: the file cannot be read, or an identity is malformed or given twice.
    """
    try:
        values = msgspec.toml.decode(Path(path).read_bytes())
    except (OSError, msgspec.DecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the fleet file: {getattr(exc, 'strerror', None) or exc}") from None
    fleet = convert({role: values.get(role, [])}, _Identities, origin=str(path))
    try:
        return _identities(getattr(fleet, role), role)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _identities(groups: Sequence[RobotGroup | ServerGroup | MonitorGroup], role: Role) -> dict[str, bytes]:
    keys: dict[str, bytes] = {}
    holders: dict[bytes, str] = {}
    for g, group in enumerate(groups):
        for name, text in group.identities.items():
            where = f"{role}[{g}].identities.{name}"
            if name not in group.names:
                raise ValueError(f"{where}: {quoted(name)} is not in {role}[{g}].names")
            try:
                key = parse_fingerprint(text)
            except WireError as exc:
                raise ValueError(f"{where}: {exc}") from None
            if key in holders:
                raise ValueError(f"{where}: also the identity of {quoted(holders[key])} (one identity, one member)")
            keys[name], holders[key] = key, name
    return keys


def password_names(path: str) -> set[str]:
    """The names in a passwords file, parsed as zenoh parses it (passwords are not kept).

    Blank lines are skipped; every other line is ``name:password`` (split at the first colon,
    both sides trimmed, neither empty). Errors name the line, never its content.

    Raises:
        ValueError: the file cannot be read or a line is malformed.
    """
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ValueError(f"router.passwords_file: cannot read {path!r}: {reason}") from None
    names = set()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        name, colon, password = line.partition(":")
        if not colon or not name.strip() or not password.strip():
            raise ValueError(f"router.passwords_file: {path!r} line {number} is not name:password")
        names.add(name.strip())
    return names


# ---------------------------------------------------------------------------- checks
def _checked(fleet: Fleet, origin: str, base_dir: Path) -> Fleet:
    fleet = _resolved(fleet, base_dir)
    try:
        _check(fleet)
    except ValueError as exc:
        raise ConfigError(f"{origin}: {exc}") from None
    return fleet


def _resolved(fleet: Fleet, base_dir: Path) -> Fleet:
    def absolute(value: str | None) -> str | None:
        return None if value is None else str(base_dir / value)

    router = fleet.router
    tls = router.tls
    if tls is not None:
        tls = msgspec.structs.replace(
            tls,
            certificate=str(base_dir / tls.certificate),
            private_key=str(base_dir / tls.private_key),
            root_ca=absolute(tls.root_ca),
        )
    router = msgspec.structs.replace(router, tls=tls, passwords_file=absolute(router.passwords_file))
    return msgspec.structs.replace(fleet, router=router)


def _check(fleet: Fleet) -> None:
    _check_router(fleet.router)
    _check_names(fleet)
    _identities(fleet.robots, "robots")
    _identities(fleet.servers, "servers")
    _identities(fleet.monitors, "monitors")
    if fleet.router.connect and not fleet.routers:
        raise ValueError(
            "routers: router.connect joins other routers, but no [[routers]] group names them "
            "(every message to and from them would be denied)"
        )


def _check_router(router: RouterSection) -> None:
    tls = router.tls
    if tls is not None:
        _check_tls(router, tls)
    else:
        for i, endpoint in enumerate(router.listen):
            if endpoint.startswith("tls/"):
                raise ValueError(f"router.listen[{i}] = {quoted(endpoint)}: a tls/ endpoint needs [router.tls]")
    mtls = tls is not None and tls.mtls
    if router.passwords_file is None:
        if not mtls:
            raise ValueError(
                "router: nobody can be identified; add [router.tls] with mtls = true (members named by "
                "certificate) or router.passwords_file (members named by user name)"
            )
    elif mtls:
        raise ValueError(
            "router.passwords_file: members are named by certificate when router.tls.mtls = true; "
            "remove the passwords file or set mtls = false"
        )
    else:
        _check_file("router.passwords_file", router.passwords_file)
    if router.connect and not mtls:
        # zenoh's user/password check is one-way: the joined router would see who connected,
        # but the connecting router could not tell the router it joined from a stranger.
        raise ValueError(
            "router.connect: joining other routers needs certificates on both sides "
            "([router.tls] with mtls = true); passwords only authenticate the router that connects"
        )


def _check_tls(router: RouterSection, tls: RouterTls) -> None:
    _check_pem("router.tls.certificate", tls.certificate, "CERTIFICATE")
    _check_pem("router.tls.private_key", tls.private_key, "PRIVATE KEY")
    _check_pem("router.tls.root_ca", tls.root_ca, "CERTIFICATE")
    if not tls.mtls:
        return
    if tls.root_ca is None:
        raise ValueError("router.tls.root_ca: required when mtls = true (the CA that signed member certificates)")
    for i, endpoint in enumerate(router.listen):
        if not endpoint.startswith("tls/"):
            raise ValueError(
                f"router.listen[{i}] = {quoted(endpoint)}: under mTLS members are named by their certificate; "
                "listen on tls/"
            )


def _check_file(key: str, path: str | None) -> None:
    if path is not None and not Path(path).is_file():
        raise ValueError(f"{key}: file {path!r} does not exist")


def _check_pem(key: str, path: str | None, label: str) -> None:
    """The file exists and holds a PEM block of ``label`` (a swapped certificate/key is common)."""
    _check_file(key, path)
    if path is None:
        return
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        raise ValueError(f"{key}: cannot read {path!r}: {exc.strerror}") from None
    if "-----BEGIN " not in text or f"{label}-----" not in text:
        raise ValueError(f"{key}: {path!r} holds no PEM {label.lower()}")


def _check_names(fleet: Fleet) -> None:
    seen: dict[str, str] = {}
    passwords = None if fleet.router.passwords_file is None else password_names(fleet.router.passwords_file)
    for role in ("servers", "robots", "monitors", "routers"):
        for g, group in enumerate(getattr(fleet, role)):
            for n, name in enumerate(group.names):
                where = f"{role}[{g}].names[{n}]"
                if name in seen:
                    raise ValueError(
                        f"{where} = {quoted(name)}: already listed at {seen[name]} (an identity has one role)"
                    )
                seen[name] = where
                if not name.isprintable() or name != name.strip():
                    raise ValueError(f"{where} = {quoted(name)}: control characters or surrounding spaces")
                if role == "robots":
                    _check_segment(where, name, "a robot's name is its client id")
                if passwords is not None and name not in passwords:
                    raise ValueError(f"{where} = {quoted(name)}: no line for it in router.passwords_file")
            if isinstance(group, ServerGroup):
                for field in ("apps", "models"):
                    for i, value in enumerate(getattr(group, field)):
                        if value != "*":
                            _check_segment(f"{role}[{g}].{field}[{i}]", value, 'a key segment or "*"')
    if not seen:
        raise ValueError("fleet names nobody: add [[servers]], [[robots]] or [[monitors]] groups")


def _check_segment(where: str, value: str, why: str) -> None:
    try:
        segment(value)
    except WireError as exc:
        raise ValueError(f"{where} = {quoted(value)}: {why}; {exc}") from None
