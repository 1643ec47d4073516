"""The server manifest: one TOML file describing one model on one device.

Parsed strictly through `servo.config`: an unknown key, a wrong type, a value out of range or a
missing required key stops the server at start with one line naming the key
(``manifest.toml: serving.max_sessions = 0: expected int >= 1``). Relative paths are used as
given (relative to the working directory); ``servo-serve`` also makes a ``package.module:factory``
policy source importable from the manifest's own directory.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from servo.config import (
    ByteLimit,
    ConfigError,
    FieldError,
    NonEmptyStr,
    NonNegativeFloat,
    NonNegativeInt,
    NonNegativeSeconds,
    Port,
    PositiveFloat,
    PositiveInt,
    Seconds,
    doc,
    load_toml,
    parse_toml,
)
from servo.transport import DEFAULT_LOCAL_ENDPOINT, ZenohSettings, exposed_endpoint
from servo.wire import WireError, parse_fingerprint, segment
from servo.wire.openpi import ObservationKeys

_DEVICE = re.compile(r"(cpu|cuda(:\d+)?|mps)")

#: Raised for every manifest problem (kept as the server's name for `servo.config.ConfigError`).
ManifestError = ConfigError


def _segment(field: str, value: str) -> None:
    try:
        segment(value, what=field)
    except WireError as exc:
        raise FieldError(field, str(exc).removeprefix(f"{field} ")) from None


class ModelSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[model]``: what to load and how to run it."""

    source: Annotated[NonEmptyStr, doc("A built-in policy (reference, lerobot) or 'package.module:factory'.")]
    options: Annotated[dict[str, Any], doc("Keyword arguments of the policy factory.")] = {}
    revision: Annotated[str, doc("Checkpoint revision reported to clients.")] = ""
    device: Annotated[str, doc("cpu, cuda, cuda:N or mps; the policy is built on it.")] = "cpu"
    dtype: Annotated[
        Literal["float32", "bfloat16", "float16"], doc("Compute dtype; bfloat16/float16 run under autocast on CUDA.")
    ] = "float32"
    warmup: Annotated[NonNegativeInt, doc("Forwards run before the server reports ready.")] = 2
    compile: Annotated[bool, doc("Wrap the policy's networks in torch.compile.")] = False
    frames: Annotated[
        Literal["auto", "host", "device"],
        doc(
            "Where camera frames are decoded: auto = onto the GPU (nvJPEG, pinned copies) when the "
            "device is CUDA and the policy takes device frames; host = numpy on the CPU; device = always."
        ),
    ] = "auto"
    cuda_graphs: Annotated[
        bool,
        doc(
            "Replay the policy's fixed-shape networks from CUDA graphs captured at warm-up "
            "(policies with use_cuda_graphs(); no effect off CUDA)."
        ),
    ] = False

    def check(self) -> None:
        """The device string must name a torch device type servo can place a policy on."""
        if not _DEVICE.fullmatch(self.device):
            raise FieldError("device", "must be cpu, cuda, cuda:N or mps")


class ServingSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[serving]``: how sessions are admitted and scheduled."""

    app: Annotated[str, doc("First key segment after @servo: groups a fleet's servers.")] = "default"
    replica: Annotated[str, doc("This replica's id (default: host name and pid).")] = ""
    mode: Annotated[
        Literal["shared", "exclusive"],
        doc("shared (many sessions) or exclusive (one); chunk-stateful policies are exclusive."),
    ] = "shared"
    max_sessions: Annotated[PositiveInt, doc("Sessions served at once (capacity).")] = 8
    max_batch: Annotated[
        PositiveInt, doc("Most observations in one forward of a batching policy; 1 = round-robin.", le=1024)
    ] = 16
    batch_linger_ms: Annotated[
        NonNegativeFloat,
        doc("Longest an observation waits for batch partners (ms), never past a member's deadline.", le=100),
    ] = 5.0
    default_task: Annotated[str, doc("Task of sessions that name none.", max_length=1024)] = ""
    pin_task: Annotated[bool, doc("Refuse sessions asking for another task than default_task.")] = False
    strict_fps: Annotated[bool, doc("Refuse (instead of warn) robots at another fps.")] = False
    max_observation_bytes: Annotated[ByteLimit, doc("Largest observation accepted (bytes).")] = 16 * 1024 * 1024
    client_grace_s: Annotated[NonNegativeSeconds, doc("How long a vanished client's session is kept (s).")] = 3.0

    def check(self) -> None:
        """Key segments and the task pin."""
        _segment("app", self.app)
        if self.replica:
            _segment("replica", self.replica)
        if self.pin_task and not self.default_task:
            raise FieldError("pin_task", "needs serving.default_task to pin")


class LimitsSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[limits]``: bounds on everything a remote peer controls (`servo.server.admission`).

    Each bound is checked where the message enters, before the work it guards: image sizes on
    the observation's declared and JPEG-header dimensions before any pixel is decoded, rates
    before the handshake or the mailbox. A refusal is counted by reason and answered (or
    dropped, for floods), never fatal.
    """

    max_image_pixels: Annotated[
        PositiveInt,
        doc(
            "Largest camera frame accepted (height x width), checked on the JPEG header "
            "before decoding; frames must also match the policy's camera shape.",
            le=8192 * 8192,
        ),
    ] = 2048 * 2048
    decode_budget_pixels: Annotated[
        PositiveInt, doc("Pixels one observation may ask the server to decode, all cameras together.")
    ] = 4 * 2048 * 2048
    session_opens_per_s: Annotated[
        PositiveFloat,
        doc(
            "Session opens accepted per second, all robots together (average); without enrolment, robots new "
            "to this server have a budget of this size and returning ones another."
        ),
    ] = 50.0
    session_open_burst: Annotated[PositiveInt, doc("Session opens accepted at once before the rate applies.")] = 50
    client_opens_per_s: Annotated[
        PositiveFloat, doc("Session opens accepted per second from one robot identity (average).")
    ] = 2.0
    client_open_burst: Annotated[PositiveInt, doc("Session opens accepted at once from one robot identity.")] = 5
    observations_per_s: Annotated[
        PositiveFloat,
        doc(
            "Authenticated observations one session may send per second; more are answered "
            "with a rate_limited error, unserved."
        ),
    ] = 5000.0
    observation_burst: Annotated[
        PositiveInt, doc("Observations one session may send at once before the rate applies.")
    ] = 500
    idle_session_s: Annotated[
        Seconds, doc("A session without an authenticated observation for this long is closed (s).")
    ] = 60.0


class OpsSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[ops]``: health/metrics HTTP endpoint and the audit log."""

    health_host: Annotated[str, doc("Address of the health/metrics endpoint.")] = "127.0.0.1"
    health_port: Annotated[Port, doc("Port of /healthz and /metrics; 0 disables.")] = 9100
    audit_log: Annotated[str, doc("One JSON line per request to this file; '-' = stdout.")] = ""
    robot_metrics: Annotated[
        NonNegativeInt,
        doc('Most robots with /metrics series of their own at once (the rest: robot="other").', le=100_000),
    ] = 256


class EnrolledRobot(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One entry of ``[security] robots``: a robot's name and the identity it signs with."""

    name: Annotated[str, doc("The robot's client id (its certificate CN behind a router).")]
    identity: Annotated[str, doc("Its Ed25519 fingerprint, ed25519:… (printed by servo-edge --identity).")]

    def check(self) -> None:
        """A usable name and fingerprint."""
        _segment("name", self.name)
        try:
            parse_fingerprint(self.identity)
        except WireError as exc:
            raise FieldError("identity", str(exc)) from None


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
            "Allow a plain (not TLS) listen endpoint on a non-loopback address: anyone on the network then "
            "reads every robot's observations and chunks."
        ),
    ] = False
    listen_beside_router: Annotated[
        bool,
        doc(
            "Allow listening, or peer mode, while connected to a router: peers reaching the listen endpoint, "
            "or linked to by gossip, bypass the router's access control."
        ),
    ] = False

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
        if self.fleet and not Path(self.fleet).is_file():
            raise FieldError("fleet", "file does not exist")


class OpenpiSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[frontends.openpi]``: a WebSocket endpoint speaking openpi's policy-server protocol.

    Every connection is one servo session on this server: the same admission, capacity,
    scheduling, per-session processor, audit log and metrics as a robot's.
    """

    listen: Annotated[str, doc("host:port of the WebSocket endpoint (and its /healthz).", min_length=3)] = (
        "127.0.0.1:8000"
    )
    max_connections: Annotated[
        PositiveInt, doc("Open connections at once; more are refused with HTTP 503.", le=4096)
    ] = 16
    max_message_bytes: Annotated[
        ByteLimit, doc("Largest message accepted; a larger one closes the connection (1009).")
    ] = 16 * 1024 * 1024
    max_request_rate_hz: Annotated[
        PositiveFloat, doc("Requests per second one connection may make; faster ones wait.")
    ] = 200.0
    request_timeout_s: Annotated[
        Seconds, doc("How long a request may wait for its chunk before an error reply (s).")
    ] = 10.0
    metadata: Annotated[
        dict[str, Any], doc("Sent to every client on connect as openpi's policy metadata (servo adds 'servo').")
    ] = {}
    observation: ObservationKeys = ObservationKeys()

    @property
    def host(self) -> str:
        """The listening address (brackets of an IPv6 address removed)."""
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        """The listening port (0: any free one)."""
        return int(self.listen.rpartition(":")[2])

    def check(self) -> None:
        """``listen`` is host:port; ``metadata`` leaves the ``servo`` key to the server."""
        host, _, port = self.listen.rpartition(":")
        if not host.strip("[]") or not port.isdigit() or int(port) > 65535:
            raise FieldError("listen", "expected host:port, e.g. 127.0.0.1:8000 or 0.0.0.0:8000")
        if "servo" in self.metadata:
            raise FieldError("metadata.servo", "reserved: the server fills it with the policy's description")


class FrontendsSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[frontends]``: other protocols served by the same policy, scheduler and sessions."""

    openpi: OpenpiSection | None = None


class TrajectoryEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[[trajectories]]``: a named recorded episode the server hands out for replay."""

    name: Annotated[str, doc("Name edges ask for (--replay server:NAME).")]
    path: Annotated[str, doc("A .servo recording.")]

    def check(self) -> None:
        """A usable name and an existing file."""
        _segment("name", self.name)
        if not Path(self.path).is_file():
            raise FieldError("path", "file does not exist")


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The whole manifest."""

    model: ModelSection
    serving: ServingSection = ServingSection()
    zenoh: ZenohSettings = ZenohSettings(listen=[DEFAULT_LOCAL_ENDPOINT])
    ops: OpsSection = OpsSection()
    security: SecuritySection = SecuritySection()
    limits: LimitsSection = LimitsSection()
    frontends: FrontendsSection = FrontendsSection()
    trajectories: list[TrajectoryEntry] = []

    def check(self) -> None:
        """Trajectory names are unique; nothing is exposed by accident (see `SecuritySection`)."""
        names = [t.name for t in self.trajectories]
        if len(set(names)) != len(names):
            raise FieldError("trajectories", "names must be unique")
        z, security = self.zenoh, self.security
        for i, endpoint in enumerate(z.listen):
            if not security.insecure and exposed_endpoint(endpoint):
                raise FieldError(
                    f"zenoh.listen[{i}]",
                    f"{endpoint!r} is not TLS and not loopback: anyone on the network would read every robot's "
                    "observations and chunks; listen on tls/ (docs/guides/security.md), or accept that with "
                    "--insecure ([security] insecure = true)",
                )
        if z.connect and not security.listen_beside_router:
            accept = "or accept that with --listen-beside-router ([security] listen_beside_router = true)"
            if z.listen:
                raise FieldError(
                    "zenoh.listen",
                    f"{z.listen[0]!r} beside connect {z.connect[0]!r}: peers reaching this port bypass the access "
                    'control of the router connected to; set zenoh.listen = [] and zenoh.mode = "client" (servers '
                    f"are clients of the router), {accept}",
                )
            if z.mode == "peer":
                # A peer dials every peer the router gossips about, with no listen endpoint of its own.
                raise FieldError(
                    "zenoh.mode",
                    f"'peer' with connect {z.connect[0]!r}: a peer links straight to every peer the router "
                    "announces, and those links bypass the router's access control; set zenoh.mode = "
                    f'"client" (servers are clients of the router), {accept}',
                )


def parse_manifest(text: str, *, origin: str = "<manifest>", overrides: dict[str, Any] | None = None) -> Manifest:
    """Parse and validate manifest TOML.

    Raises:
        ManifestError: anything wrong, with the key named.
    """
    return parse_toml(text, Manifest, origin=origin, overrides=overrides)


def load_manifest(path: str | Path, *, overrides: dict[str, Any] | None = None) -> Manifest:
    """Read and parse a manifest file; ``overrides`` replace keys by dotted name (CLI flags).

    Raises:
        ManifestError: unreadable file, or anything wrong with the key named.
    """
    return load_toml(path, Manifest, overrides=overrides)
