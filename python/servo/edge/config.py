"""Edge configuration: every option of seeds/001 §9.4 that applies, from TOML and the CLI.

Precedence: defaults < ``--config edge.toml`` < command-line flags. Every field below is also a flag
(``buffer_time_s`` -> ``--buffer-time-s``) whose help is the field's description; values are
checked by `servo.config`, so a bad one is one line naming the option and the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from servo.client import TrustedServers
from servo.client.codec import AutoCodec, JpegQuality
from servo.client.verify import MAX_CHUNK_STEPS
from servo.config import ConfigError, FieldError, convert, doc, load_toml
from servo.transport import (
    DEFAULT_LOCAL_ENDPOINT,
    CertificateError,
    TlsSettings,
    UsrPwdSettings,
    ZenohSettings,
    common_name,
)
from servo.wire import WireError, segment

Fallback = Literal["hold", "repeat_last", "zero"]
InferenceMode = Literal["remote", "sync", "rtc"]

#: Raised for every edge configuration problem (the edge's name for `servo.config.ConfigError`).
EdgeConfigError = ConfigError


class EdgeConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the edge runtime needs besides the robot (see each field's description)."""

    connect: Annotated[list[str], doc("Zenoh endpoint(s) of the server or router to connect to.")] = msgspec.field(
        default_factory=lambda: [DEFAULT_LOCAL_ENDPOINT]
    )
    zenoh_mode: Annotated[
        Literal["client", "peer"], doc("client: this robot dials out (fleets); peer: a direct link.")
    ] = "client"
    app: Annotated[str, doc("Only use servers of this app (a key segment); any when empty.")] = ""
    model: Annotated[str, doc("Only use servers of this model key (e.g. servo-reference); any when empty.")] = ""
    replica: Annotated[str, doc("Only use this replica; any when empty.")] = ""
    revision: Annotated[
        str,
        doc("Only use servers of this model revision; when empty, a new revision is taken at an episode boundary."),
    ] = ""
    client_id: Annotated[
        str,
        doc("This robot's id; when empty: tls_cert's common name, else auth_user, else random."),
    ] = ""
    task: Annotated[str, doc("Task instruction sent with every observation (the prompt of a VLA).")] = ""
    jpeg_quality: Annotated[
        JpegQuality,
        doc("Camera frames: auto (raw or JPEG per request, from measured costs), 0 raw, or a JPEG quality 1-100."),
    ] = "auto"
    jpeg_auto_qualities: Annotated[
        list[Annotated[int, msgspec.Meta(ge=1, le=100)]],
        doc("JPEG qualities jpeg_quality = auto may use besides raw pixels.", min_length=1, max_length=8),
    ] = msgspec.field(default_factory=lambda: list(AutoCodec().qualities))
    buffer_time_s: Annotated[
        float, doc("Send the next observation when the queue holds less than this many seconds.", gt=0)
    ] = 0.5
    max_action_age_s: Annotated[
        float, doc("Never execute an action whose observation is older than this (staleness bound, s).", gt=0)
    ] = 3.0
    degraded_after_s: Annotated[
        float, doc("A request outstanding this long -> DEGRADED, even with actions queued (s).", gt=0)
    ] = 1.0
    request_timeout_s: Annotated[float, doc("Per-request watchdog: a hung server (s).", gt=0)] = 5.0
    connect_timeout_s: Annotated[float, doc("How long to look for a server at start before giving up (s).", gt=0)] = (
        10.0
    )
    timeout_streak: Annotated[int, doc("Request timeouts in a row that count as a lost server.", ge=1)] = 2
    reconnect_initial_backoff_s: Annotated[
        float, doc("First wait when no usable server answers (doubles; a server token ends it, s).", gt=0)
    ] = 0.5
    reconnect_max_backoff_s: Annotated[float, doc("Ceiling of the reconnect delay (s).", gt=0)] = 10.0
    max_offline_s: Annotated[float, doc("Offline this long -> DEAD: park the arm and exit (s).", gt=0)] = 60.0
    fallback: Annotated[
        Fallback, doc("What the robot does when no fresh action exists: hold, repeat_last or zero.")
    ] = "hold"
    velocity_scale: Annotated[
        float, doc("Scales every joint's velocity limit (below 1 slows every motion down).", gt=0, le=10)
    ] = 1.0
    rtc: Annotated[bool, doc("Real-time chunking: replace the queue's rest with each chunk (else append).")] = True
    execution_horizon: Annotated[
        int, doc("Queued steps shipped with each request as the RTC prefix.", ge=0, le=10_000)
    ] = 10
    inference: Annotated[
        InferenceMode, doc("remote (a policy server), or sync / rtc: run the policy in this process (torch).")
    ] = "remote"
    policy: Annotated[str, doc("Local engines: policy source, a built-in name or package.module:factory.")] = (
        "reference"
    )
    policy_options: Annotated[
        dict[str, Any], doc("Local engines: keyword arguments of the policy factory (values are JSON).")
    ] = {}
    device: Annotated[str, doc("Local engines: torch device the policy runs on (cpu, cuda, cuda:N, mps).")] = "cpu"
    tls_root_ca: Annotated[str, doc("TLS: CA certificate trusted for the server or router.")] = ""
    tls_cert: Annotated[str, doc("mTLS: this robot's certificate.")] = ""
    tls_key: Annotated[str, doc("mTLS: this robot's private key.")] = ""
    auth_user: Annotated[str, doc("User/password fleets: this robot's user name in the router's passwords file.")] = ""
    auth_password_file: Annotated[str, doc("User/password fleets: a file holding only this robot's password.")] = ""
    trusted_servers: Annotated[
        list[str],
        doc(
            "Servers to trust: ed25519:… fingerprints (printed by servo-serve) and/or replica ids "
            "(meaningful only behind a servo-router); any server when empty."
        ),
    ] = []
    max_chunk_steps: Annotated[
        int, doc("Longest chunk accepted (steps); longer ones are rejected, never merged.", ge=1, le=4096)
    ] = MAX_CHUNK_STEPS
    lease_ms: Annotated[int, doc("Zenoh lease this robot announces: how fast its death is noticed (ms).", ge=100)] = (
        1000
    )
    tags: Annotated[dict[str, str], doc("Free-form labels sent at session open (KEY=VALUE).")] = {}
    telemetry_period_s: Annotated[
        float, doc("Publish a signed status record for monitors this often (s); 0: never.", ge=0, le=60)
    ] = 1.0

    def check(self) -> None:
        """Rules that span options; raises `FieldError` naming the option."""
        if self.reconnect_initial_backoff_s > self.reconnect_max_backoff_s:
            raise FieldError("reconnect_initial_backoff_s", "must be <= reconnect_max_backoff_s")
        if self.inference == "remote" and not self.connect:
            raise FieldError("connect", "name at least one endpoint of the server or router")
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
        for name in ("client_id", "auth_user"):
            value = getattr(self, name)
            if value:
                try:
                    segment(value, what=name)
                except WireError as exc:
                    raise FieldError(name, str(exc).removeprefix(f"{name} ")) from None
        try:
            self.zenoh_settings().check()
        except FieldError as exc:
            field = "zenoh_mode" if exc.field == "mode" else exc.field
            raise FieldError(field, exc.message) from None

    def trusted(self) -> TrustedServers:
        """The parsed ``trusted_servers`` pins.

        Raises:
            WireError: a malformed entry.
        """
        return TrustedServers.parse(self.trusted_servers)

    def resolved_client_id(self, default: str) -> str:
        """The client id: ``client_id``, else tls_cert's common name, else ``auth_user``, else ``default``.

        Behind a router the robot's name *is* its certificate CN (or user name): the router's
        access control only lets it use keys under that name, so any other id could not work.

        Raises:
            ConfigError: the certificate's common name cannot be read, or is no valid client id.
        """
        if self.client_id:
            return self.client_id
        if self.tls_cert:
            try:
                name = common_name(self.tls_cert)
                return segment(name, what="client_id")
            except (CertificateError, WireError) as exc:
                raise ConfigError(
                    f"tls_cert: cannot use the certificate's common name as client id ({exc}); pass --client-id <CN>"
                ) from None
        return self.auth_user or default

    def zenoh_settings(self) -> ZenohSettings:
        """Zenoh settings of the robot: a client dialling out, fast lease and retry."""
        tls = None
        if self.tls_root_ca or self.tls_cert:
            tls = TlsSettings(
                root_ca_certificate=self.tls_root_ca or None,
                connect_certificate=self.tls_cert or None,
                connect_private_key=self.tls_key or None,
                enable_mtls=bool(self.tls_cert),
            )
        auth = UsrPwdSettings(self.auth_user, self.auth_password_file) if self.auth_user else None
        return ZenohSettings(
            mode=self.zenoh_mode, connect=list(self.connect), lease_ms=self.lease_ms, tls=tls, auth=auth
        )


def load_config(path: str | None = None, flags: Mapping[str, Any] | None = None) -> EdgeConfig:
    """Merge a TOML file and command-line values into a checked EdgeConfig.

    Args:
        path: ``--config`` file, if any.
        flags: Values given on the command line, by field name (they replace the file's).

    Raises:
        EdgeConfigError: unreadable file, unknown option, wrong type or out-of-range value.
    """
    if path:
        return load_toml(path, EdgeConfig, overrides=flags)
    return convert(dict(flags or {}), EdgeConfig, origin="command line")
