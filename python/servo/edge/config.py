"""Edge configuration: every option of the edge, in sections their consumers take.

::

    inference, task, client_id, tags,    which engine runs (`servo.edge.engines`), who this robot is
    telemetry_period_s                   and how often it tells monitors how it is
    [link]       LinkConfig              the Zenoh session, reconnects and the frame codec
    [server]     ServerConfig            which servers the remote engine may use
    [security]   SecurityConfig          TLS, router authentication, server pins, chunk bounds
    [pipeline]   PipelineConfig          when to ask for a chunk and how to merge it
    [control]    ControlConfig           what the control loop does with queued actions
    [failsafe]   FailSafeConfig          the watchdogs of the fail-safe state machine
    [local]      LocalConfig             the policy of the local engines (sync, rtc)
    [replay]     ReplayConfig            the trajectory the replay engine drains

Each component takes only its section (`ChunkPipeline` the pipeline's, `FailSafe` the fail-safe's,
the control loop the control section); an engine, where sections meet, takes the whole `EdgeConfig`.

Precedence: defaults < ``--config edge.toml`` < command-line flags. Every field is also a flag
named after it alone (``[pipeline] buffer_time_s`` -> ``--buffer-time-s``; names are unique
across sections) whose help is the field's description; values are checked by `servo.config`, so
a bad one is one line naming the option and the file (a key of the flat layout: where it moved).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import msgspec

from servo._core import AuthError, exchange_public_key
from servo.client import TrustedServers
from servo.client.codec import AutoCodec, JpegQuality
from servo.client.known import KnownServers
from servo.client.verify import MAX_CHUNK_STEPS
from servo.config import (
    ConfigError,
    FieldError,
    LeaseMs,
    NonNegativeSeconds,
    PositiveInt,
    Quality,
    Seconds,
    convert,
    doc,
    flag_keys,
    load_toml,
    nest,
)
from servo.edge.actions import ControlConfig
from servo.edge.failsafe import FailSafeConfig
from servo.edge.pipeline import PipelineConfig
from servo.identity import Identity, robot_identity
from servo.join import JoinToken, JoinTokenError
from servo.transport import (
    DEFAULT_LEASE_MS,
    DEFAULT_LOCAL_ENDPOINT,
    CertificateError,
    TlsSettings,
    UsrPwdSettings,
    ZenohSettings,
    common_name,
    exposed_endpoint,
    quic_first,
)
from servo.wire import WireError, parse_fingerprint, segment

InferenceMode = Literal["remote", "sync", "rtc", "replay"]

#: How often a robot re-dials a server or router it lost (ms): a restarted server is linked again
#: within this of listening, so its liveliness token (and the re-handshake it triggers) follows at
#: once. A failed dial is one refused TCP connect.
REDIAL_MS = 100


class LinkConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[link]``: how this robot reaches its server: the Zenoh session, reconnects, the frame codec."""

    connect: Annotated[list[str], doc("Zenoh endpoint(s) of the server or router to connect to.")] = msgspec.field(
        default_factory=lambda: [DEFAULT_LOCAL_ENDPOINT]
    )
    zenoh_mode: Annotated[
        Literal["client", "peer"], doc("client: this robot dials out (fleets); peer: a direct link.")
    ] = "client"
    lease_ms: Annotated[LeaseMs, doc("Zenoh lease this robot announces: how fast its freeze is noticed (ms).")] = (
        DEFAULT_LEASE_MS
    )
    prefer_quic: Annotated[bool, doc("Dial quic/ at each tls/ endpoint first (same certificates), then tls/.")] = True
    connect_timeout_s: Annotated[Seconds, doc("How long to look for a server at start before giving up (s).")] = 10.0
    reconnect_initial_backoff_s: Annotated[
        Seconds, doc("First wait when no usable server answers (doubles; a server token ends it, s).")
    ] = 0.5
    reconnect_max_backoff_s: Annotated[Seconds, doc("Ceiling of the reconnect delay (s).")] = 10.0
    jpeg_quality: Annotated[
        JpegQuality,
        doc("Camera frames: auto (raw or JPEG per request, from measured costs), 0 raw, or a JPEG quality 1-100."),
    ] = "auto"
    jpeg_auto_qualities: Annotated[
        list[Quality],
        doc("JPEG qualities jpeg_quality = auto may use besides raw pixels.", min_length=1, max_length=8),
    ] = msgspec.field(default_factory=lambda: list(AutoCodec().qualities))

    def check(self) -> None:
        """Endpoint syntax and the backoff's order; raises `FieldError` naming the option."""
        if self.reconnect_initial_backoff_s > self.reconnect_max_backoff_s:
            raise FieldError("reconnect_initial_backoff_s", "must be <= reconnect_max_backoff_s")
        try:
            ZenohSettings(mode=self.zenoh_mode, connect=list(self.connect)).check()
        except FieldError as exc:
            raise FieldError("zenoh_mode" if exc.field == "mode" else exc.field, exc.message) from None

    def auto_codec(self) -> AutoCodec:
        """How ``jpeg_quality = "auto"`` chooses, with this link's qualities."""
        return AutoCodec(qualities=list(self.jpeg_auto_qualities))


class ServerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[server]``: which servers the remote engine may use when several answer."""

    app: Annotated[str, doc("Only use servers of this app (a key segment); any when empty.")] = ""
    model: Annotated[str, doc("Only use servers of this model key (e.g. servo-reference); any when empty.")] = ""
    replica: Annotated[str, doc("Only use this replica; any when empty.")] = ""
    revision: Annotated[
        str,
        doc("Only use servers of this model revision; when empty, a new revision is taken at an episode boundary."),
    ] = ""


class SecurityConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[security]``: TLS and authentication to a router, which servers to trust, what a chunk may hold."""

    tls_root_ca: Annotated[str, doc("TLS: CA certificate trusted for the server or router.")] = ""
    tls_cert: Annotated[str, doc("mTLS: this robot's certificate.")] = ""
    tls_key: Annotated[str, doc("mTLS: this robot's private key.")] = ""
    auth_user: Annotated[str, doc("User/password fleets: this robot's user name in the router's passwords file.")] = ""
    auth_password_file: Annotated[str, doc("User/password fleets: a file holding only this robot's password.")] = ""
    trusted_servers: Annotated[
        list[str],
        doc(
            "Servers to trust (pins): ed25519:… fingerprints (printed by servo-serve) and/or replica ids "
            "(meaningful only behind a servo-router); when empty, the ones trusted on first use (known_servers)."
        ),
    ] = []
    known_servers: Annotated[
        str,
        doc("File of the servers trusted on first use, per app/model; known_servers in servo's directory when empty."),
    ] = ""
    identity_key: Annotated[
        str,
        doc("This robot's Ed25519 identity, which signs its session opens; robot.key in servo's directory when empty."),
    ] = ""
    insecure: Annotated[
        bool,
        doc("Allow a plain (not TLS) link off loopback: anyone on the path may join it (sessions stay encrypted)."),
    ] = False
    join: Annotated[
        str,
        doc(
            "A join token servo-serve printed: enrols this robot on first contact and trusts that server "
            "(and its certificate) without trust on first use."
        ),
    ] = ""
    peer_beside_router: Annotated[
        bool,
        doc(
            "Allow zenoh_mode = peer while connected to a router: peers the router announces link to this robot "
            "directly and bypass its access control."
        ),
    ] = False
    max_chunk_steps: Annotated[
        PositiveInt, doc("Longest chunk accepted (steps); longer ones are rejected, never merged.", le=4096)
    ] = MAX_CHUNK_STEPS

    def check(self) -> None:
        """Pairs that go together, files that must exist, well-formed pins; raises `FieldError`."""
        if bool(self.tls_cert) != bool(self.tls_key):
            raise FieldError("tls_cert" if self.tls_key else "tls_key", "mTLS needs both tls_cert and tls_key")
        if bool(self.auth_user) != bool(self.auth_password_file):
            raise FieldError(
                "auth_user" if self.auth_password_file else "auth_password_file",
                "user/password authentication needs both auth_user and auth_password_file",
            )
        for name in ("tls_root_ca", "tls_cert", "tls_key", "auth_password_file"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise FieldError(name, "file does not exist")
        try:
            self.trusted()
        except WireError as exc:
            raise FieldError("trusted_servers", str(exc)) from None
        try:
            self.join_token()
        except JoinTokenError as exc:
            raise FieldError("join", str(exc)) from None
        if self.auth_user:
            try:
                segment(self.auth_user, what="auth_user")
            except WireError as exc:
                raise FieldError("auth_user", str(exc).removeprefix("auth_user ")) from None

    def trusted(self) -> TrustedServers:
        """The parsed ``trusted_servers`` pins.

        Raises:
            WireError: a malformed entry.
        """
        return TrustedServers.parse(self.trusted_servers)

    def join_token(self) -> JoinToken | None:
        """The parsed ``join`` token, or None.

        Raises:
            JoinTokenError: a malformed token.
        """
        return JoinToken.parse(self.join) if self.join else None

    def known(self) -> KnownServers:
        """The servers trusted on first use (used when nothing is pinned)."""
        return KnownServers(self.known_servers or None)

    def identity(self) -> Identity:
        """This robot's identity (``identity_key``, else this machine's; created on first use).

        Raises:
            IdentityError: the file cannot be read or created.
        """
        return robot_identity(self.identity_key)

    def tls(self) -> TlsSettings | None:
        """The Zenoh TLS settings, or None without TLS."""
        if not (self.tls_root_ca or self.tls_cert):
            return None
        return TlsSettings(
            root_ca_certificate=self.tls_root_ca or None,
            connect_certificate=self.tls_cert or None,
            connect_private_key=self.tls_key or None,
            enable_mtls=bool(self.tls_cert),
        )

    def auth(self) -> UsrPwdSettings | None:
        """The Zenoh user/password settings, or None without them."""
        return UsrPwdSettings(self.auth_user, self.auth_password_file) if self.auth_user else None


class LocalConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[local]``: the policy the local engines (``inference = "sync"`` or ``"rtc"``) run in this process."""

    policy: Annotated[str, doc("Local engines: policy source, a built-in name or package.module:factory.")] = (
        "reference"
    )
    policy_options: Annotated[
        dict[str, Any], doc("Local engines: keyword arguments of the policy factory (values are JSON).")
    ] = {}
    device: Annotated[str, doc("Local engines: torch device the policy runs on (cpu, cuda, cuda:N, mps).")] = "cpu"


class ReplayConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[replay]``: the recorded trajectory ``inference = "replay"`` drains (``--replay`` sets both)."""

    trajectory: Annotated[
        str, doc("Trajectory to replay: a recording file, or server:NAME of the server's library.")
    ] = ""
    loop: Annotated[bool, doc("Replay: start over (through a bridge) at the end.")] = False


class EdgeConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the edge runtime needs besides the robot: a few top-level options and one section per consumer."""

    #: Keys of the flat layout, by the dotted key that replaced each (filled in below).
    moved_keys: ClassVar[Mapping[str, str]] = {}

    inference: Annotated[
        InferenceMode,
        doc("remote (a policy server), sync / rtc (run the policy in this process: torch) or replay."),
    ] = "remote"
    task: Annotated[str, doc("Task instruction sent with every observation (the prompt of a VLA).")] = ""
    client_id: Annotated[
        str,
        doc(
            "This robot's id; when empty: tls_cert's common name, else auth_user, else this host's name with "
            "join, else random."
        ),
    ] = ""
    tags: Annotated[dict[str, str], doc("Free-form labels sent at session open (KEY=VALUE).")] = {}
    telemetry_period_s: Annotated[
        NonNegativeSeconds, doc("Publish a signed status record for monitors this often (s); 0: never.", le=60)
    ] = 1.0
    telemetry_readers: Annotated[
        list[str],
        doc("Operators (servo-monitor --identity) telemetry is encrypted to, besides those the server's ack names."),
    ] = []
    link: Annotated[LinkConfig, doc("How this robot reaches its server.")] = msgspec.field(default_factory=LinkConfig)
    server: Annotated[ServerConfig, doc("Which servers to use.")] = msgspec.field(default_factory=ServerConfig)
    security: Annotated[SecurityConfig, doc("TLS, authentication, trusted servers.")] = msgspec.field(
        default_factory=SecurityConfig
    )
    pipeline: Annotated[PipelineConfig, doc("When to ask for a chunk and how to merge it.")] = msgspec.field(
        default_factory=PipelineConfig
    )
    control: Annotated[ControlConfig, doc("What the control loop does with queued actions.")] = msgspec.field(
        default_factory=ControlConfig
    )
    failsafe: Annotated[FailSafeConfig, doc("Watchdogs of the fail-safe state machine.")] = msgspec.field(
        default_factory=FailSafeConfig
    )
    local: Annotated[LocalConfig, doc("The policy of the local engines.")] = msgspec.field(default_factory=LocalConfig)
    replay: Annotated[ReplayConfig, doc("The trajectory of the replay engine.")] = msgspec.field(
        default_factory=ReplayConfig
    )

    def check(self) -> None:
        """Rules that span sections; raises `FieldError` naming the option."""
        if self.inference == "remote" and not self.link.connect:
            raise FieldError("link.connect", "name at least one endpoint of the server or router")
        for i, endpoint in enumerate(self.link.connect):
            if not self.security.insecure and exposed_endpoint(endpoint):
                raise FieldError(
                    f"link.connect[{i}]",
                    f"{endpoint!r} is not TLS and not loopback: anyone on the path could join this robot's link "
                    "(its sessions stay encrypted); connect over tls/ (--tls-root-ca), or accept that with --insecure",
                )
        if self.inference == "replay" and not self.replay.trajectory:
            raise FieldError("replay.trajectory", "name a recording file or server:NAME to replay (--replay)")
        if self.client_id:
            try:
                segment(self.client_id, what="client_id")
            except WireError as exc:
                raise FieldError("client_id", str(exc).removeprefix("client_id ")) from None
        self.readers()

    def readers(self) -> list[bytes]:
        """The keys of ``telemetry_readers``; raises `FieldError` naming a malformed one."""
        keys = []
        for i, text in enumerate(self.telemetry_readers):
            try:
                keys.append(parse_fingerprint(text))
                exchange_public_key(keys[-1])
            except (WireError, AuthError) as exc:
                raise FieldError(f"telemetry_readers[{i}]", str(exc)) from None
        return keys

    def resolved_client_id(self, default: str) -> str:
        """The client id: ``client_id``, else tls_cert's common name, else ``auth_user``, else ``default``.

        Behind a router the robot's name *is* its certificate CN (or user name): the router's
        access control only lets it use keys under that name, so any other id could not work.

        Raises:
            ConfigError: the certificate's common name cannot be read, or is no valid client id.
        """
        if self.client_id:
            return self.client_id
        security = self.security
        if security.tls_cert:
            try:
                name = common_name(security.tls_cert)
                return segment(name, what="client_id")
            except (CertificateError, WireError) as exc:
                raise ConfigError(
                    f"tls_cert: cannot use the certificate's common name as client id ({exc}); pass --client-id <CN>"
                ) from None
        return security.auth_user or default

    def zenoh_settings(self) -> ZenohSettings:
        """The robot's Zenoh settings: a client dialling out (quic/ before tls/), fast lease and retry, its TLS."""
        link, security = self.link, self.security
        settings = ZenohSettings(
            mode=link.zenoh_mode,
            connect=list(link.connect),
            lease_ms=link.lease_ms,
            retry_init_ms=REDIAL_MS // 2,
            retry_max_ms=REDIAL_MS,
            tls=security.tls(),
            auth=security.auth(),
        )
        return quic_first(settings) if link.prefer_quic else settings


#: ``--buffer-time-s`` -> ``pipeline.buffer_time_s``: every option's dotted key, by its flag's name.
FLAG_KEYS = flag_keys(EdgeConfig)
EdgeConfig.moved_keys = {name: key for name, key in FLAG_KEYS.items() if name != key}


def load_edge_config(path: str | None = None, flags: Mapping[str, Any] | None = None) -> EdgeConfig:
    """Merge a TOML file and command-line values into a checked EdgeConfig.

    Args:
        path: ``--config`` file, if any.
        flags: Values given on the command line, by option name (``buffer_time_s``, whatever its
            section); they replace the file's.

    Raises:
        ConfigError: unreadable file, unknown or moved option, wrong type or out-of-range value.
    """
    overrides = {FLAG_KEYS.get(name, name): value for name, value in (flags or {}).items()}
    if path:
        return load_toml(path, EdgeConfig, overrides=overrides)
    return convert(nest(overrides), EdgeConfig, origin="command line")
