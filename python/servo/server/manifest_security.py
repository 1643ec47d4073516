"""The manifest's ``[security]``: the replica's identity, the robots and operators it knows, its exposure.

Parsed strictly with the rest of the manifest (`servo.server.manifest`); what the names and
identities listed here let in is decided by `servo.server.enrolment` and `servo.access`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec

from servo._core import AuthError, exchange_public_key
from servo.config import FieldError, NonNegativeSeconds, PositiveInt, Seconds, doc
from servo.wire import WireError, parse_fingerprint, segment


def segment_field(field: str, value: str) -> None:
    """Refuse a ``field`` that is not one key segment (a name, an app, a replica id).

    Raises:
        FieldError: naming ``field``.
    """
    try:
        segment(value, what=field)
    except WireError as exc:
        raise FieldError(field, str(exc).removeprefix(f"{field} ")) from None


def _named_identity(name: str, identity: str, *, receives: bool = False) -> None:
    """A key-segment name and an Ed25519 fingerprint (one records can be encrypted to, if ``receives``)."""
    segment_field("name", name)
    try:
        key = parse_fingerprint(identity)
        if receives:
            exchange_public_key(key)
    except (WireError, AuthError) as exc:
        raise FieldError("identity", str(exc)) from None


class EnrolledRobot(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One entry of ``[security] robots``: a robot's name and the identity it signs with."""

    name: Annotated[str, doc("The robot's client id (its certificate CN behind a router).")]
    identity: Annotated[str, doc("Its Ed25519 fingerprint, ed25519:… (printed by servo-edge --identity).")]

    def check(self) -> None:
        """A usable name and fingerprint."""
        _named_identity(self.name, self.identity)


class Operator(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One entry of ``[security] operators``: a person's or a monitor's name and identity."""

    name: Annotated[str, doc("Who it is (in logs).")]
    identity: Annotated[str, doc("Its Ed25519 fingerprint, ed25519:… (printed by servo-monitor --identity).")]

    def check(self) -> None:
        """A usable name and fingerprint, and a key robots can encrypt to."""
        _named_identity(self.name, self.identity, receives=True)


class SecuritySection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[security]``: the replica's identity, the robots it admits and what it may expose."""

    identity_key: Annotated[
        str,
        doc(
            "File of the Ed25519 identity that signs session acks, trajectories and notices (created 0600 "
            "when missing); servers/<app>.key in servo's directory when empty."
        ),
    ] = ""
    ephemeral_identity: Annotated[
        bool, doc("A new identity at every start, kept nowhere: edges cannot pin or remember it.")
    ] = False
    robots: Annotated[
        list[EnrolledRobot], doc("Enrolled robots: only these may open sessions, each under its own name.")
    ] = []
    fleet: Annotated[str, doc("A fleet file whose [[robots]] identities are enrolled too (servo-router's).")] = ""
    takeover_idle_s: Annotated[
        Seconds,
        doc(
            "A client's live session may be replaced by another robot's open under its id only "
            "after this long without an authenticated observation (s)."
        ),
    ] = 30.0
    insecure: Annotated[
        bool,
        doc(
            "Allow a plain (not TLS) listen endpoint on a non-loopback address: anyone on the network may then "
            "join the server's Zenoh network (sessions stay encrypted end to end)."
        ),
    ] = False
    listen_beside_router: Annotated[
        bool,
        doc(
            "Allow listening, or peer mode, while connected to a router: peers reaching the listen endpoint, "
            "or linked to by gossip, bypass the router's access control."
        ),
    ] = False
    allow_any_robot: Annotated[
        bool,
        doc(
            "Admit robots nobody enrolled although the server is reachable off loopback (and openpi clients "
            "without an API key): anyone who reaches it may open sessions and take capacity."
        ),
    ] = False
    expose_health: Annotated[
        bool, doc("Allow ops.health_host off loopback: anyone on the network then reads /healthz and /metrics.")
    ] = False
    roster: Annotated[
        str,
        doc(
            "File of the robots enrolled by join tokens, the tokens and the openpi API keys (servo-serve robots "
            "manages it); servers/<app>.roster in servo's directory when empty."
        ),
    ] = ""
    join_token_ttl_s: Annotated[
        NonNegativeSeconds,
        doc("How long the join token servo-serve prints at start is valid (s); 0 prints none.", le=30 * 86400),
    ] = 3600.0
    join_token_uses: Annotated[
        PositiveInt, doc("How many robots may join with the token servo-serve prints at start.", le=10_000)
    ] = 1

    operators: Annotated[
        list[Operator], doc("Operators and monitors: they read the fleet's audit trail and its robots' telemetry.")
    ] = []

    def check(self) -> None:
        """One identity source; robot names and identities unique; the fleet file exists."""
        if self.ephemeral_identity and self.identity_key:
            raise FieldError("ephemeral_identity", "an ephemeral identity is kept nowhere: remove identity_key")
        names: dict[str, int] = {}
        keys: dict[str, int] = {}
        for i, robot in enumerate(self.robots):
            if robot.name in names:
                raise FieldError(f"robots[{i}].name", f"{robot.name!r} is enrolled at robots[{names[robot.name]}] too")
            if robot.identity in keys:
                where = f"robots[{keys[robot.identity]}]"
                raise FieldError(f"robots[{i}].identity", f"enrolled for {where} too (one identity, one robot)")
            names[robot.name], keys[robot.identity] = i, i
        operators: dict[str, int] = {}
        for i, operator in enumerate(self.operators):
            if operator.identity in operators:
                raise FieldError(f"operators[{i}].identity", f"listed at operators[{operators[operator.identity]}] too")
            operators[operator.identity] = i
        if self.fleet and not Path(self.fleet).is_file():
            raise FieldError("fleet", "file does not exist")
