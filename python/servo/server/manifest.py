"""The server manifest: one TOML file describing one model on one device.

Parsed strictly: an unknown key, a wrong type or a missing required key stops the server at
start with one message naming the key (e.g. ``serving.max_sessions: expected int, got str``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import msgspec

from servo.transport import DEFAULT_LOCAL_ENDPOINT, ZenohSettings
from servo.wire import WireError, segment

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?|mps)$")


class ManifestError(ValueError):
    """The manifest cannot be used; the message names the key."""


class ModelSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[model]``: what to load and how to run it."""

    source: str
    options: dict[str, Any] = {}
    revision: str = ""
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    warmup: int = 2
    compile: bool = False


class ServingSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[serving]``: how sessions are admitted and scheduled."""

    app: str = "default"
    replica: str = ""
    mode: Literal["shared", "exclusive"] = "shared"
    max_sessions: int = 8
    default_task: str = ""
    pin_task: bool = False
    strict_fps: bool = False
    max_observation_bytes: int = 64 * 1024 * 1024
    client_grace_s: float = 3.0


class OpsSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[ops]``: health/metrics HTTP endpoint and the audit log."""

    health_host: str = "127.0.0.1"
    health_port: int = 9100
    audit_log: str = ""


class TrajectoryEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[[trajectories]]``: a named recorded episode the server hands out for replay."""

    name: str
    path: str


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The whole manifest."""

    model: ModelSection
    serving: ServingSection = ServingSection()
    zenoh: ZenohSettings = ZenohSettings(listen=[DEFAULT_LOCAL_ENDPOINT])
    ops: OpsSection = OpsSection()
    trajectories: list[TrajectoryEntry] = []


_PATH = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")


def _readable(exc: msgspec.ValidationError) -> str:
    text = str(exc)
    match = _PATH.search(text)
    path = match.group("path") if match else ""
    text = _PATH.sub("", text)
    path = re.sub(r"\[(\d+)\]", r"[\1]", path)
    unknown = re.match(r"Object contains unknown field `(.+)`", text)
    if unknown:
        key = f"{path}.{unknown.group(1)}" if path else unknown.group(1)
        return f"{key}: unknown key"
    missing = re.match(r"Object missing required field `(.+)`", text)
    if missing:
        key = f"{path}.{missing.group(1)}" if path else missing.group(1)
        return f"{key}: required key is missing"
    expected = re.match(r"Expected `(.+)`, got `(.+)`", text)
    if expected:
        return f"{path or '<top>'}: expected {expected.group(1)}, got {expected.group(2)}"
    return f"{path}: {text}" if path else text


def parse_manifest(text: str, *, origin: str = "<manifest>") -> Manifest:
    """Parse and validate manifest TOML.

    Raises:
        ManifestError: anything wrong, with the key named.
    """
    try:
        manifest = msgspec.toml.decode(text.encode(), type=Manifest)
    except msgspec.ValidationError as exc:
        raise ManifestError(f"{origin}: {_readable(exc)}") from None
    except msgspec.DecodeError as exc:
        raise ManifestError(f"{origin}: invalid TOML: {exc}") from None
    try:
        _validate(manifest)
    except (ValueError, WireError) as exc:
        raise ManifestError(f"{origin}: {exc}") from None
    return manifest


def load_manifest(path: str | Path) -> Manifest:
    """Read and parse a manifest file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {str(path)!r}: {exc.strerror}") from None
    return parse_manifest(text, origin=str(path))


def _validate(m: Manifest) -> None:
    if not m.model.source:
        raise ValueError("model.source: must name a built-in policy or 'package.module:factory'")
    if not _DEVICE.match(m.model.device):
        raise ValueError(f"model.device: {m.model.device!r} is not cpu, cuda, cuda:N or mps")
    if m.model.warmup < 0:
        raise ValueError(f"model.warmup: must be >= 0, got {m.model.warmup}")
    segment(m.serving.app, what="serving.app")
    if m.serving.replica:
        segment(m.serving.replica, what="serving.replica")
    if m.serving.max_sessions < 1:
        raise ValueError(f"serving.max_sessions: must be >= 1, got {m.serving.max_sessions}")
    if m.serving.pin_task and not m.serving.default_task:
        raise ValueError("serving.pin_task: needs serving.default_task to pin")
    if m.serving.client_grace_s < 0:
        raise ValueError(f"serving.client_grace_s: must be >= 0, got {m.serving.client_grace_s}")
    if not 0 <= m.ops.health_port <= 65535:
        raise ValueError(f"ops.health_port: {m.ops.health_port} is not a port (0 disables)")
    names = [t.name for t in m.trajectories]
    for i, entry in enumerate(m.trajectories):
        segment(entry.name, what=f"trajectories[{i}].name")
        if not Path(entry.path).is_file():
            raise ValueError(f"trajectories[{i}].path: file {entry.path!r} does not exist")
    if len(set(names)) != len(names):
        raise ValueError("trajectories: names must be unique")
    m.zenoh.validate()
