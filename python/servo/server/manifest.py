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
from servo.server.exposure import Accepted, refuse_exposures
from servo.server.manifest_security import SecuritySection, segment_field
from servo.transport import DEFAULT_LOCAL_ENDPOINT, ZenohSettings
from servo.wire.openpi import ObservationKeys

_DEVICE = re.compile(r"(cpu|cuda(:\d+)?|mps)")


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
    plan_forwards: Annotated[
        NonNegativeInt,
        doc("Forwards timed after the warm-up for servo-serve's capacity plan (median, p90); 0 (or warmup 0): none."),
    ] = 10
    compile: Annotated[bool, doc("Wrap the policy's networks in torch.compile.")] = False
    frames: Annotated[
        Literal["auto", "host", "device"],
        doc(
            "Where camera frames are decoded: auto = onto the GPU (nvJPEG, pinned copies) when the "
            "device is CUDA and the policy takes device frames; host = numpy on the CPU; device = always."
        ),
    ] = "auto"
    process: Annotated[
        Literal["separate", "inline"],
        doc(
            "Where the policy runs: separate = in a process of its own, so the server robots connect "
            "to never maps torch and a killed one is gone at once; inline = in the server's process "
            "(needed to decode frames onto the device)."
        ),
    ] = "separate"
    cuda_graphs: Annotated[
        bool,
        doc(
            "Replay the policy's fixed-shape networks from CUDA graphs captured at warm-up "
            "(policies with use_cuda_graphs(); no effect off CUDA)."
        ),
    ] = False

    def check(self) -> None:
        """A device servo can place a policy on; frames decoded on it only beside the policy."""
        if not _DEVICE.fullmatch(self.device):
            raise FieldError("device", "must be cpu, cuda, cuda:N or mps")
        if self.frames == "device" and self.process == "separate":
            raise FieldError("frames", '"device" decodes in the policy\'s process: set model.process = "inline"')


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
    intake_threads: Annotated[
        NonNegativeInt,
        doc("Threads that verify and decode observations (a session on one); 0 = one per core, up to 8.", le=64),
    ] = 0
    client_grace_s: Annotated[NonNegativeSeconds, doc("How long a vanished client's session is kept (s).")] = 3.0

    def check(self) -> None:
        """Key segments and the task pin."""
        segment_field("app", self.app)
        if self.replica:
            segment_field("replica", self.replica)
        if self.pin_task and not self.default_task:
            raise FieldError("pin_task", "needs serving.default_task to pin")


#: A door budget's rate (per second) and burst (`servo.server.signed_door`).
Rate = Annotated[PositiveFloat, msgspec.Meta(le=1e6)]
Burst = Annotated[PositiveInt, msgspec.Meta(le=10**6)]


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
    # Door budgets (`servo.server.signed_door`): checked before a query is read; beyond, it is dropped unanswered.
    status_queries_per_s: Annotated[Rate, doc("Signed status replies per second, all askers together.")] = 300.0
    status_query_burst: Annotated[Burst, doc("Status replies at once (a fleet's discovery, a failover).")] = 3000
    door_requests_per_s: Annotated[Rate, doc("Session opens, fetches or audit queries per second per door.")] = 100.0
    door_request_burst: Annotated[Burst, doc("Session opens, fetches or audit queries at once per door.")] = 600
    requester_requests_per_s: Annotated[Rate, doc("Trajectory fetches, or audit queries, per second per key.")] = 5.0
    requester_request_burst: Annotated[Burst, doc("Trajectory fetches, or audit queries, at once per key.")] = 20

    def check(self) -> None:
        """One requester's budget fits in its door's: nobody takes a whole door alone."""
        if self.requester_request_burst > self.door_request_burst:
            raise FieldError(
                "requester_request_burst",
                f"larger than door_request_burst ({self.door_request_burst}): one requester could empty the door",
            )
        if self.requester_requests_per_s > self.door_requests_per_s:
            raise FieldError(
                "requester_requests_per_s",
                f"larger than door_requests_per_s ({self.door_requests_per_s:g}): one requester could hold the door",
            )


class OpsSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[ops]``: health/metrics HTTP endpoint and the audit log."""

    health_host: Annotated[
        str, doc("Address of the health/metrics endpoint; off loopback it needs [security] expose_health.")
    ] = "127.0.0.1"
    health_port: Annotated[Port, doc("Port of /healthz and /metrics; 0 disables.")] = 9100
    audit_log: Annotated[str, doc("One JSON line per request to this file; '-' = stdout.")] = ""
    robot_metrics: Annotated[
        NonNegativeInt,
        doc('Most robots with /metrics series of their own at once (the rest: robot="other").', le=100_000),
    ] = 256


class OpenpiSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[frontends.openpi]``: a WebSocket endpoint speaking openpi's policy-server protocol.

    Every connection is one servo session on this server: the same scheduling, per-session
    processor, audit log and metrics as a robot's, but a capacity of its own
    (``max_connections``), so openpi clients never take a robot's slot. Off loopback the door
    speaks TLS (wss; servo's self-signed certificate when none is named) unless ``--insecure``,
    and admits only clients with an API key (``servo-serve robots api-key NAME``) unless
    ``--allow-any-robot`` (`servo.access`).
    """

    listen: Annotated[str, doc("host:port of the WebSocket endpoint (and its /healthz).", min_length=3)] = (
        "127.0.0.1:8000"
    )
    max_connections: Annotated[
        PositiveInt,
        doc(
            "Connections (each one session) at once, a capacity apart from the robots' serving.max_sessions; "
            "more are refused with HTTP 503.",
            le=4096,
        ),
    ] = 4
    certificate: Annotated[str, doc("TLS certificate of the door (wss); servo's self-signed one off loopback.")] = ""
    private_key: Annotated[str, doc("Private key of certificate.")] = ""
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
        if bool(self.certificate) != bool(self.private_key):
            raise FieldError(
                "certificate" if self.private_key else "private_key", "TLS needs both certificate and private_key"
            )
        for name in ("certificate", "private_key"):
            if getattr(self, name) and not Path(getattr(self, name)).is_file():
                raise FieldError(name, "file does not exist")


class FrontendsSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[frontends]``: other protocols served by the same policy, scheduler and sessions."""

    openpi: OpenpiSection | None = None


class TrajectoryEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[[trajectories]]``: a named recorded episode the server hands out for replay."""

    name: Annotated[str, doc("Name edges ask for (--replay server:NAME).")]
    path: Annotated[str, doc("A .servo recording.")]

    def check(self) -> None:
        """A usable name and an existing file."""
        segment_field("name", self.name)
        if not Path(self.path).is_file():
            raise FieldError("path", "file does not exist")


class RobotSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[robot]``: the robot the policy drives, for the ``servo-edge`` command ``servo-serve`` prints."""

    type: Annotated[NonEmptyStr, doc("servo-edge --robot: so100, so101, ros2, sim or package.module:factory.")]
    options: Annotated[
        dict[str, Any],
        doc("Its --robot-opt options (lists as TOML arrays); paths as the robot's computer sees them."),
    ] = {}

    def check(self) -> None:
        """A robot servo-edge knows: a built-in one or a plugin's ``package.module:factory``.

        Its options are checked where they are used, on the robot (they may name its files).
        """
        from servo.robots.registry import PLUGIN_FORM, ROBOTS

        module, sep, factory = self.type.partition(":")
        if self.type not in ROBOTS and not (sep and module and factory):
            raise FieldError("type", f"must be one of {', '.join(sorted(ROBOTS))} or {PLUGIN_FORM}")

    def option_text(self) -> dict[str, str]:
        """The options as ``--robot-opt KEY=VALUE`` values (lists comma-separated)."""
        return {key: _option_text(value) for key, value in self.options.items()}


def _option_text(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(_option_text(item) for item in value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


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
    robot: RobotSection | None = None

    def check(self) -> None:
        """Trajectory names are unique; nothing is exposed by accident (`servo.server.exposure`)."""
        names = [t.name for t in self.trajectories]
        if len(set(names)) != len(names):
            raise FieldError("trajectories", "names must be unique")
        security = self.security
        accepted = Accepted(security.insecure, security.listen_beside_router, security.expose_health)
        refuse_exposures(self.zenoh, (self.ops.health_host, self.ops.health_port), accepted)


def parse_manifest(text: str, *, origin: str = "<manifest>", overrides: dict[str, Any] | None = None) -> Manifest:
    """Parse and validate manifest TOML.

    Raises:
        ConfigError: anything wrong, with the key named.
    """
    return parse_toml(text, Manifest, origin=origin, overrides=overrides)


def load_manifest(path: str | Path, *, overrides: dict[str, Any] | None = None) -> Manifest:
    """Read and parse a manifest file; ``overrides`` replace keys by dotted name (CLI flags).

    Raises:
        ConfigError: unreadable file, or anything wrong with the key named.
    """
    return load_toml(path, Manifest, overrides=overrides)
