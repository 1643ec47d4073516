"""The table of robot drivers the edge can be asked for by name, with their options.

Every driver's options are a frozen msgspec Struct (constraints and a sentence of help per field),
converted by `servo.config` from what a user gives on the command line (``--robot-opt KEY=VALUE``,
text) or in a TOML table (typed values), so a bad option is one line naming it and what is valid.
Nothing registers itself on import: a new driver is one more row in `ROBOTS`, and a driver that
lives elsewhere (a test fake, an out-of-tree arm) is named by the path of its `RobotEntry`,
``package.module:NAME``.

A `RobotDescription` (type + options) is what the edge hands its control process, which builds
the joints there; the edge builds the cameras from the same description in its main process.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from servo.config import ConfigError, FieldError, convert, fields_of, is_sequence_type

from .calibration import CalibrationError
from .cameras import CameraGroup, OpenCVCamera, OpenCVCameraConfig
from .protocol import Cameras, NoCameras, PoseSource, Robot, RobotSpec
from .sim import SimCameraConfig, SimConfig, SimSO100
from .sim_cameras import SimCameras
from .so100 import SO100, SO100Config
from .so100_joints import JOINT_NAMES as SO100_JOINTS


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


def parse_cameras(value: str) -> list[CameraEntry]:
    """Parse a camera list such as ``"front:0:640x480@30,wrist:/dev/video2:640x480@30"``.

    The size is width x height (OpenCV's order); the source may itself contain colons (the
    ``/dev/v4l/by-path/...`` names do), so only the first field and a trailing size are split
    off. ``""`` or ``"none"`` means no cameras.

    Raises:
        ValueError: a malformed entry or a repeated name.
    """
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


def _doc(text: str, **constraints: Any) -> msgspec.Meta:
    return msgspec.Meta(description=text, **constraints)


def _checked_cameras(value: str) -> list[CameraEntry]:
    try:
        return parse_cameras(value)
    except ValueError as exc:
        raise FieldError("cameras", str(exc)) from None


class SimOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Options of the simulated SO-100 (``--robot sim``)."""

    fps: Annotated[float, _doc("Control rate (Hz).", gt=0, le=1000)] = 30.0
    cameras: Annotated[str, _doc("Simulated cameras, e.g. 'front,wrist' or 'front:640x480@30'; 'none' for none.")] = (
        "front,wrist"
    )
    time_constant_s: Annotated[float, _doc("First-order time constant of every joint (s).", gt=0)] = 0.075
    noise_std: Annotated[float, _doc("Gaussian noise added to every state reading (joint units).", ge=0)] = 0.0
    seed: Annotated[int, _doc("Seed of the sensor noise and the rendered textures.")] = 0
    initial_pose: Annotated[
        tuple[float, ...] | None, _doc("Six comma-separated joint values to start from (default: rest pose).")
    ] = None
    realtime: Annotated[bool, _doc("Advance the simulation with the monotonic clock.")] = True

    def check(self) -> None:
        """Camera syntax: simulated cameras take a size but no device."""
        for entry in _checked_cameras(self.cameras):
            if entry.source is not None:
                raise FieldError("cameras", f"simulated camera {entry.name!r} takes no device, only a size")
        if self.initial_pose is not None and len(self.initial_pose) != len(SO100_JOINTS):
            raise FieldError("initial_pose", f"needs {len(SO100_JOINTS)} values, one per joint")


class SO100Options(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Options of the real SO-100 follower arm (``--robot so100``)."""

    port: Annotated[str, _doc("Serial port of the servo bus, e.g. /dev/ttyACM0.", min_length=1)]
    calibration: Annotated[str, _doc("Path of a LeRobot calibration JSON (or give id).")] = ""
    id: Annotated[str, _doc("LeRobot robot id: its calibration file is found where LeRobot writes it.")] = ""
    cameras: Annotated[str, _doc("OpenCV cameras, e.g. 'front:0:640x480@30,wrist:/dev/video2'.")] = ""
    max_relative_target: Annotated[
        Annotated[float, msgspec.Meta(gt=0)] | None,
        _doc("Largest move per command from the measured position (joint units)."),
    ] = None
    use_degrees: Annotated[bool, _doc("Arm joints in degrees (false: LeRobot's -100..100 range).")] = True
    disable_torque_on_disconnect: Annotated[bool, _doc("Release torque when the edge disconnects.")] = True
    fps: Annotated[float, _doc("Control rate (Hz).", gt=0, le=1000)] = 30.0
    baudrate: Annotated[int, _doc("Bus baud rate.", gt=0)] = 1_000_000
    timeout_s: Annotated[float, _doc("Reply timeout of each bus packet (s).", gt=0)] = 0.05
    retries: Annotated[int, _doc("Bus retries after a bad or missing reply.", ge=0, le=10)] = 2

    def check(self) -> None:
        """Exactly one calibration source; camera syntax (every camera needs a device)."""
        if bool(self.calibration) == bool(self.id):
            raise FieldError("calibration" if self.calibration else "id", "give exactly one of calibration or id")
        for entry in _checked_cameras(self.cameras):
            if entry.source is None:
                raise FieldError("cameras", f"camera {entry.name!r} needs a device index or path")


def sim_config(options: SimOptions) -> SimConfig:
    """The `SimConfig` of sim options."""
    cameras = []
    for entry in parse_cameras(options.cameras):
        default = SimCameraConfig(entry.name)
        cameras.append(
            SimCameraConfig(
                entry.name,
                height=entry.height or default.height,
                width=entry.width or default.width,
                fps=entry.fps or default.fps,
            )
        )
    extra: dict[str, Any] = {} if options.initial_pose is None else {"initial_pose": options.initial_pose}
    return SimConfig(
        fps=options.fps,
        cameras=tuple(cameras),
        time_constant_s=options.time_constant_s,
        noise_std=options.noise_std,
        seed=options.seed,
        realtime=options.realtime,
        **extra,
    )


def make_sim(options: SimOptions) -> Robot:
    """Build the joints of a `SimSO100` from its options."""
    return SimSO100(sim_config(options))


def make_sim_cameras(options: SimOptions, poses: PoseSource) -> Cameras:
    """Build the sim's cameras, rendering the poses ``poses`` publishes."""
    return SimCameras(sim_config(options), poses)


def _opencv_cameras(options: SO100Options) -> dict[str, OpenCVCameraConfig]:
    cameras = {}
    for entry in parse_cameras(options.cameras):
        assert entry.source is not None  # SO100Options.check
        default = OpenCVCameraConfig(entry.source)
        cameras[entry.name] = OpenCVCameraConfig(
            entry.source,
            width=entry.width or default.width,
            height=entry.height or default.height,
            fps=entry.fps or default.fps,
        )
    return cameras


def make_so100(options: SO100Options) -> Robot:
    """Build an `SO100`; its calibration file is loaded here, before any port is touched."""
    config = SO100Config(
        port=options.port,
        calibration_path=options.calibration or None,
        robot_id=options.id or None,
        cameras=_opencv_cameras(options),
        max_relative_target=options.max_relative_target,
        use_degrees=options.use_degrees,
        disable_torque_on_disconnect=options.disable_torque_on_disconnect,
        fps=options.fps,
        baudrate=options.baudrate,
        timeout_s=options.timeout_s,
        retries=options.retries,
    )
    return SO100(config)


def make_so100_cameras(options: SO100Options, poses: PoseSource) -> Cameras:
    """Build the arm's OpenCV cameras (nothing is opened until `connect`)."""
    return CameraGroup({name: OpenCVCamera.from_config(cam, name) for name, cam in _opencv_cameras(options).items()})


def no_cameras(options: object, poses: PoseSource) -> Cameras:
    """The cameras of a robot without any."""
    return NoCameras()


@dataclass(frozen=True)
class RobotEntry:
    """A row of `ROBOTS`: the driver's options, how to build its joints and its cameras."""

    options: type[msgspec.Struct]
    build: Callable[[Any], Robot]
    summary: str
    cameras: Callable[[Any, PoseSource], Cameras] = no_cameras


ROBOTS: dict[str, RobotEntry] = {
    "sim": RobotEntry(
        SimOptions, make_sim, "simulated SO-100 arm with rendered cameras (no hardware)", make_sim_cameras
    ),
    "so100": RobotEntry(SO100Options, make_so100, "real SO-100 follower arm (Feetech STS3215 bus)", make_so100_cameras),
}
"""Robot type -> options and factories."""


class RobotDescription(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Which robot to drive and with which options: what the edge hands its control process.

    Plain data (it crosses to the control process as JSON): the joints are built where they are
    driven, the cameras where frames are used, from the same description.
    """

    robot: Annotated[str, _doc("A robot type of ROBOTS, or package.module:NAME naming a RobotEntry.")]
    options: Annotated[dict[str, Any], _doc("Flat options (command-line text or typed TOML values).")] = {}

    def build(self) -> Robot:
        """The robot's joints (not connected).

        Raises:
            ConfigError: unknown robot, bad option, or a combination the driver refuses.
            CalibrationError: a real arm's calibration file is missing or malformed.
        """
        return make_robot(self.robot, self.options)

    def build_cameras(self, poses: PoseSource) -> Cameras:
        """The robot's cameras (not connected); simulated ones render what ``poses`` publishes.

        Raises:
            ConfigError: unknown robot or bad option.
        """
        return _entry(self.robot).cameras(robot_options(self.robot, self.options), poses)

    def spec(self) -> RobotSpec:
        """The robot's spec (building a driver opens nothing).

        Raises:
            ConfigError, CalibrationError: as `build`.
        """
        return self.build().spec


def robot_options(robot_type: str, options: Mapping[str, object] | None = None) -> msgspec.Struct:
    """Convert flat options (text from the command line, or typed TOML values) for one robot type.

    Raises:
        ConfigError: unknown robot type, unknown option or invalid value (one line, naming it).
    """
    entry = _entry(robot_type)
    values: dict[str, Any] = {}
    for name, value in (options or {}).items():
        # Lists are given comma-separated on the command line.
        field = next((f for f in msgspec.structs.fields(entry.options) if f.name == name), None)
        if field is not None and isinstance(value, str) and is_sequence_type(field.type):
            value = [item.strip() for item in value.split(",")]
        values[name] = value
    return convert(values, entry.options, origin=f"robot {robot_type!r}", strict=False)


def make_robot(robot_type: str, options: Mapping[str, object] | None = None) -> Robot:
    """Build a robot by type name from flat options.

    Raises:
        ConfigError: unknown robot type, unknown option, invalid value, or a combination the
            driver refuses (e.g. a pose outside the joint limits).
        CalibrationError: a real arm's calibration file is missing or malformed.
    """
    entry = _entry(robot_type)
    parsed = robot_options(robot_type, options)
    try:
        return entry.build(parsed)
    except ValueError as exc:
        if isinstance(exc, ConfigError | CalibrationError):
            raise
        raise ConfigError(f"robot {robot_type!r}: {exc}") from None


def options_help(robot_type: str) -> list[str]:
    """One line per option of a robot type: ``name (type, default): description``."""
    lines = []
    for doc in fields_of(_entry(robot_type).options):
        default = "required" if doc.required else f"default {doc.default!r}"
        lines.append(f"{doc.name} ({doc.type_text}, {default}): {doc.description}")
    return lines


def _entry(robot_type: str) -> RobotEntry:
    if ":" in robot_type:
        return _entry_at(robot_type)
    entry = ROBOTS.get(robot_type)
    if entry is None:
        raise ConfigError(f"unknown robot type {robot_type!r}; valid types: {', '.join(sorted(ROBOTS))}")
    return entry


def _entry_at(path: str) -> RobotEntry:
    module_name, _, name = path.partition(":")
    try:
        entry = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"robot {path!r}: cannot import it ({exc})") from None
    if not isinstance(entry, RobotEntry):
        raise ConfigError(f"robot {path!r}: expected a RobotEntry, got {type(entry).__name__}")
    return entry
