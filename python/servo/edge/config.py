"""Edge configuration: every option of seeds/001 §9.4 that applies, from TOML and the CLI.

Precedence: defaults < ``--config edge.toml`` < command-line flags. Each field below is also a
flag (``buffer_time_s`` -> ``--buffer-time-s``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import msgspec

from servo.transport import DEFAULT_LOCAL_ENDPOINT, TlsSettings, ZenohSettings

Fallback = Literal["hold", "repeat_last", "zero"]
InferenceMode = Literal["remote", "sync", "rtc"]


class EdgeConfigError(ValueError):
    """The configuration cannot be used; the message names the option."""


class EdgeConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the edge runtime needs besides the robot.

    Attributes:
        connect: Zenoh endpoints of the server (or router) to connect to.
        zenoh_mode: ``client`` (default: robots dial out) or ``peer``.
        app: Only use servers of this app (key segment); any when empty.
        model: Only use servers of this model key (e.g. ``servo-reference``); any when empty.
        replica: Only use this replica; any when empty.
        client_id: This robot's id; random when empty.
        task: Task instruction sent with every observation (VLA prompt).
        jpeg_quality: JPEG quality for camera frames; 0 sends raw pixels.
        buffer_time_s: Send the next observation when the queue holds less than this.
        max_action_age_s: Never execute an action whose observation is older than this.
        degraded_after_s: No chunk for this long while a request is out -> DEGRADED.
        request_timeout_s: Per-request watchdog (a hung server).
        connect_timeout_s: How long to look for a server at start before giving up.
        timeout_streak: Consecutive timeouts that count as a lost server -> RECONNECTING.
        reconnect_initial_backoff_s: First reconnect delay (doubles each attempt).
        reconnect_max_backoff_s: Ceiling of the reconnect delay.
        max_offline_s: Offline this long -> DEAD (safe teardown).
        fallback: What the robot does when no fresh action exists: hold, repeat_last, zero.
        velocity_scale: Scales the robot's per-joint velocity limits used by the slew limiter
            (below 1 slows every motion down, e.g. for a first run on new hardware).
        rtc: Real-time chunking (replace merge + prefix conditioning) instead of append.
        execution_horizon: Max steps of the leftover chunk shipped as RTC prefix.
        inference: ``remote`` (server), ``sync`` or ``rtc`` (local policy; imports torch).
        policy: Local engines: policy source (built-in name or ``module:factory``).
        policy_options: Local engines: options passed to the policy factory.
        device: Local engines: torch device.
        tls_root_ca: TLS: CA certificate trusted for the server/router.
        tls_cert: mTLS: this robot's certificate.
        tls_key: mTLS: this robot's private key.
        lease_ms: Zenoh lease announced by this robot (how fast a dead robot is noticed).
        tags: Free-form labels sent at session open.
    """

    connect: list[str] = msgspec.field(default_factory=lambda: [DEFAULT_LOCAL_ENDPOINT])
    zenoh_mode: Literal["client", "peer"] = "client"
    app: str = ""
    model: str = ""
    replica: str = ""
    client_id: str = ""
    task: str = ""
    jpeg_quality: int = 90
    buffer_time_s: float = 0.5
    max_action_age_s: float = 3.0
    degraded_after_s: float = 1.0
    request_timeout_s: float = 5.0
    connect_timeout_s: float = 10.0
    timeout_streak: int = 2
    reconnect_initial_backoff_s: float = 0.5
    reconnect_max_backoff_s: float = 10.0
    max_offline_s: float = 60.0
    fallback: Fallback = "hold"
    velocity_scale: float = 1.0
    rtc: bool = True
    execution_horizon: int = 10
    inference: InferenceMode = "remote"
    policy: str = "reference"
    policy_options: dict[str, Any] = {}
    device: str = "cpu"
    tls_root_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    lease_ms: int = 1000
    tags: dict[str, str] = {}

    def validate(self) -> EdgeConfig:
        """Range checks; returns self. Raises EdgeConfigError naming the option."""
        positive = (
            "buffer_time_s",
            "max_action_age_s",
            "degraded_after_s",
            "request_timeout_s",
            "connect_timeout_s",
            "max_offline_s",
            "velocity_scale",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise EdgeConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.jpeg_quality <= 100:
            raise EdgeConfigError(f"jpeg_quality must be 0 (raw) or 1..100, got {self.jpeg_quality}")
        if self.timeout_streak < 1:
            raise EdgeConfigError(f"timeout_streak must be >= 1, got {self.timeout_streak}")
        if not 0 < self.reconnect_initial_backoff_s <= self.reconnect_max_backoff_s:
            raise EdgeConfigError("reconnect_initial_backoff_s must be > 0 and <= reconnect_max_backoff_s")
        if self.execution_horizon < 0:
            raise EdgeConfigError(f"execution_horizon must be >= 0, got {self.execution_horizon}")
        if self.inference == "remote" and not self.connect:
            raise EdgeConfigError("connect: name at least one endpoint of the server or router")
        try:
            self.zenoh_settings().validate()
        except ValueError as exc:
            raise EdgeConfigError(str(exc)) from None
        return self

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
        return ZenohSettings(mode=self.zenoh_mode, connect=list(self.connect), lease_ms=self.lease_ms, tls=tls)


_SCALARS = (int, float, str, bool)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--flag`` per scalar/list field of EdgeConfig (defaults left unset so TOML wins)."""
    group = parser.add_argument_group("edge options (also settable in --config TOML)")
    for field in msgspec.structs.fields(EdgeConfig):
        flag = "--" + field.name.replace("_", "-")
        kind = field.type
        default = field.default_factory() if field.default_factory is not msgspec.NODEFAULT else field.default
        help_text = f"default: {default!r}"
        if kind is bool:
            group.add_argument(
                flag,
                dest=field.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        elif get_origin(kind) is Literal:
            group.add_argument(flag, dest=field.name, choices=get_args(kind), default=None, help=help_text)
        elif kind in _SCALARS:
            group.add_argument(flag, dest=field.name, type=kind, default=None, help=help_text)
        elif get_origin(kind) is list:
            group.add_argument(
                flag,
                dest=field.name,
                action="append",
                default=None,
                help=help_text + " (repeatable)",
            )
        elif get_origin(kind) is dict:
            group.add_argument(
                flag,
                dest=field.name,
                action="append",
                default=None,
                metavar="KEY=VALUE",
                help=help_text + " (repeatable)",
            )


def load_config(path: str | None, args: argparse.Namespace | None = None) -> EdgeConfig:
    """Merge TOML file and CLI flags into a validated EdgeConfig.

    Raises:
        EdgeConfigError: unreadable file, unknown option, wrong type or out-of-range value.
    """
    values: dict[str, Any] = {}
    if path:
        try:
            text = Path(path).read_bytes()
        except OSError as exc:
            raise EdgeConfigError(f"cannot read config {path!r}: {exc.strerror}") from None
        try:
            values = msgspec.toml.decode(text)
        except msgspec.DecodeError as exc:
            raise EdgeConfigError(f"{path}: invalid TOML: {exc}") from None
    if args is not None:
        for field in msgspec.structs.fields(EdgeConfig):
            value = getattr(args, field.name, None)
            if value is None:
                continue
            if get_origin(field.type) is dict:
                raw = get_args(field.type)[1] is str
                value = dict(_pair(item, field.name, raw=raw) for item in value)
            values[field.name] = value
    try:
        config = msgspec.convert(values, EdgeConfig)
    except msgspec.ValidationError as exc:
        raise EdgeConfigError(_readable(str(exc), path)) from None
    return config.validate()


def _pair(item: str, name: str, *, raw: bool) -> tuple[str, Any]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise EdgeConfigError(f"--{name.replace('_', '-')} expects KEY=VALUE, got {item!r}")
    if raw:
        return key, value
    try:
        return key, msgspec.json.decode(value)
    except msgspec.DecodeError:
        return key, value


def _readable(text: str, origin: str | None) -> str:
    where = f"{origin}: " if origin else ""
    if text.startswith("Object contains unknown field"):
        name = text.split("`")[1]
        return f"{where}{name}: unknown option"
    if " - at `$." in text:
        message, path = text.rsplit(" - at `$.", 1)
        return f"{where}{path.rstrip('`')}: {message.replace('`', '')}"
    return where + text
