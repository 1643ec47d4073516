"""The table of robot drivers the edge can be asked for by name.

Every factory takes the flat options a user gives on the command line or in a TOML table (values
may be strings or already-typed TOML values) and returns a `Robot`. Nothing registers itself on
import: a new driver is one more row in `ROBOTS`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .cameras import OpenCVCameraConfig
from .protocol import Robot
from .sim import SimCameraConfig, SimConfig, SimSO100
from .so100 import SO100, SO100Config

RobotFactory = Callable[[Mapping[str, object]], Robot]


@dataclass(frozen=True)
class _Option:
    parse: Callable[[object], object]
    help: str


def _text(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("expected a non-empty string")
    return value


def _int(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return int(value.strip())
    raise ValueError(f"expected an integer, got {type(value).__name__}")


def _float(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        return float(value.strip())
    raise ValueError(f"expected a number, got {type(value).__name__}")


def _positive(value: object) -> float:
    number = _float(value)
    if not number > 0:
        raise ValueError("must be positive")
    return number


def _bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _BOOLS:
        return _BOOLS[value.strip().lower()]
    raise ValueError("expected true/false")


_BOOLS = {"true": True, "1": True, "yes": True, "on": True}
_BOOLS |= {"false": False, "0": False, "no": False, "off": False}


def _floats(value: object) -> tuple[float, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise ValueError("expected comma-separated numbers")
    return tuple(_float(item) for item in items)


@dataclass(frozen=True)
class CameraEntry:
    """One parsed item of a ``cameras`` option, ``name[:source][:WxH[@FPS]]``. Immutable."""

    name: str
    source: int | str | None
    width: int | None
    height: int | None
    fps: float | None


_SIZE = re.compile(r"(?P<w>\d+)x(?P<h>\d+)(?:@(?P<fps>\d+(?:\.\d*)?))?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


def parse_cameras(value: object) -> list[CameraEntry]:
    """Parse a camera list such as ``"front:0:640x480@30,wrist:/dev/video2:640x480@30"``.

    The size is width x height (OpenCV's order); the source may itself contain colons (the
    ``/dev/v4l/by-path/...`` names do), so only the first field and a trailing size are split
    off. ``""`` or ``"none"`` means no cameras. A TOML list of such strings is accepted too.
    """
    if isinstance(value, list | tuple):
        value = ",".join(_text(item) for item in value)
    if not isinstance(value, str):
        raise ValueError("expected a string like 'front:0:640x480@30,wrist:2'")
    if value.strip().lower() in ("", "none"):
        return []
    entries = []
    for item in value.split(","):
        parts = item.strip().split(":")
        name, rest = parts[0], parts[1:]
        if not _NAME.fullmatch(name):
            raise ValueError(f"camera {item!r}: {name!r} is not a valid camera name")
        size = _SIZE.fullmatch(rest[-1]) if rest else None
        if size:
            rest.pop()
        source_text = ":".join(rest)
        source: int | str | None = None
        if source_text:
            source = int(source_text) if source_text.isdigit() else source_text
        entries.append(
            CameraEntry(
                name=name,
                source=source,
                width=int(size["w"]) if size else None,
                height=int(size["h"]) if size else None,
                fps=float(size["fps"]) if size and size["fps"] else None,
            )
        )
    names = [entry.name for entry in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"camera names repeat in {names}")
    return entries


def _sim_cameras(value: object) -> tuple[SimCameraConfig, ...]:
    cameras = []
    for entry in parse_cameras(value):
        if entry.source is not None:
            raise ValueError(f"simulated camera {entry.name!r} takes no source, only a size")
        default = SimCameraConfig(entry.name)
        cameras.append(
            SimCameraConfig(
                entry.name,
                height=entry.height or default.height,
                width=entry.width or default.width,
                fps=entry.fps or default.fps,
            )
        )
    return tuple(cameras)


def _opencv_cameras(value: object) -> dict[str, OpenCVCameraConfig]:
    cameras = {}
    for entry in parse_cameras(value):
        if entry.source is None:
            raise ValueError(f"camera {entry.name!r} needs a device index or path")
        default = OpenCVCameraConfig(entry.source)
        cameras[entry.name] = OpenCVCameraConfig(
            entry.source,
            width=entry.width or default.width,
            height=entry.height or default.height,
            fps=entry.fps or default.fps,
        )
    return cameras


_SIM_OPTIONS: dict[str, _Option] = {
    "fps": _Option(_positive, "control rate (default 30)"),
    "cameras": _Option(_sim_cameras, "e.g. 'front,wrist' or 'front:640x480@30'; 'none' for none"),
    "time_constant_s": _Option(_positive, "joint first-order time constant (default 0.075)"),
    "noise_std": _Option(_float, "Gaussian noise on read_state, in joint units (default 0)"),
    "seed": _Option(_int, "seed of noise and textures (default 0)"),
    "initial_pose": _Option(_floats, "six comma-separated joint values (default: rest pose)"),
    "realtime": _Option(_bool, "advance with the monotonic clock (default true)"),
}

_SO100_OPTIONS: dict[str, _Option] = {
    "port": _Option(_text, "serial port of the servo bus, e.g. /dev/ttyACM0 (required)"),
    "calibration": _Option(_text, "path of a LeRobot calibration JSON"),
    "id": _Option(_text, "LeRobot robot id, to find its calibration file (instead of a path)"),
    "cameras": _Option(_opencv_cameras, "e.g. 'front:0:640x480@30,wrist:/dev/video2'"),
    "max_relative_target": _Option(_positive, "largest move per command, joint units"),
    "use_degrees": _Option(_bool, "degrees for the arm joints (default true)"),
    "disable_torque_on_disconnect": _Option(_bool, "release torque on disconnect (default true)"),
    "fps": _Option(_positive, "control rate (default 30)"),
    "baudrate": _Option(_int, "bus baud rate (default 1000000)"),
    "timeout_s": _Option(_positive, "bus reply timeout (default 0.05)"),
    "retries": _Option(_int, "bus retries after a bad or missing reply (default 2)"),
}


def _parse(robot: str, options: Mapping[str, object], schema: dict[str, _Option]) -> dict[str, Any]:
    valid = ", ".join(sorted(schema))
    unknown = sorted(set(options) - set(schema))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for robot {robot!r}; valid options: {valid}")
    # Any: each value was checked by its option's parser, which is what the config expects.
    parsed: dict[str, Any] = {}
    for name, value in options.items():
        try:
            parsed[name] = schema[name].parse(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"invalid value {value!r} for option {name!r} of robot {robot!r}: {exc} ({schema[name].help})"
            ) from exc
    return parsed


def make_sim(options: Mapping[str, object]) -> Robot:
    """Build a `SimSO100` from flat options (see ``ROBOT_OPTIONS["sim"]``)."""
    parsed = _parse("sim", options, _SIM_OPTIONS)
    try:
        config = SimConfig(**parsed)
    except ValueError as exc:
        raise ValueError(f"robot 'sim': {exc}") from exc
    return SimSO100(config)


def make_so100(options: Mapping[str, object]) -> Robot:
    """Build an `SO100` from flat options (see ``ROBOT_OPTIONS["so100"]``).

    The calibration file is loaded here, so a missing or malformed one fails before any port
    is touched.
    """
    parsed = _parse("so100", options, _SO100_OPTIONS)
    if "port" not in parsed:
        raise ValueError("robot 'so100' needs the option 'port'; valid options: " + ", ".join(sorted(_SO100_OPTIONS)))
    if ("calibration" in parsed) == ("id" in parsed):
        raise ValueError("robot 'so100' needs exactly one of the options 'calibration' or 'id'")
    parsed["calibration_path"] = parsed.pop("calibration", None)
    parsed["robot_id"] = parsed.pop("id", None)
    try:
        config = SO100Config(**parsed)
    except ValueError as exc:
        raise ValueError(f"robot 'so100': {exc}") from exc
    return SO100(config)


ROBOTS: dict[str, RobotFactory] = {
    "sim": make_sim,
    "so100": make_so100,
}
"""Robot type -> factory taking flat options."""

ROBOT_OPTIONS: dict[str, dict[str, str]] = {
    "sim": {name: option.help for name, option in _SIM_OPTIONS.items()},
    "so100": {name: option.help for name, option in _SO100_OPTIONS.items()},
}
"""Robot type -> option name -> help text, for command-line help."""


def make_robot(robot_type: str, options: Mapping[str, object] | None = None) -> Robot:
    """Build a robot by type name.

    Args:
        robot_type: A key of `ROBOTS`.
        options: Flat options for that robot.

    Raises:
        ValueError: Unknown robot type, unknown option or invalid value; the message names it
            and lists what is valid.
    """
    factory = ROBOTS.get(robot_type)
    if factory is None:
        raise ValueError(f"unknown robot type {robot_type!r}; valid types: {', '.join(sorted(ROBOTS))}")
    return factory(options or {})
