"""Robots by name: the table of built-ins, or any importable ``package.module:factory`` (a plugin).

The contract, the same for built-ins (`servo.robots.builtin`) and plugins::

    class KochOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
        port: Annotated[NonEmptyStr, doc("Serial port of the bus.")]  # servo.config's types and doc

    def make_koch(options: KochOptions) -> Robot | RobotParts:
        ...  # its docstring's first line is the summary --robot-help shows

* The factory takes one parameter, annotated with a frozen msgspec Struct: servo converts the
  user's options into it (``--robot-opt KEY=VALUE`` text, or typed TOML values) through
  `servo.config`, so a bad option is one line naming it, and the Struct's field descriptions are
  the help (``servo-edge --robot mypkg.koch:make_koch --robot-help``). A factory without a
  parameter takes no options.
* It returns the joints (a `Robot`), or `RobotParts` with a maker of the cameras too.
* It is called in two processes: the edge's main process (for the spec, and the cameras) and the
  control process (for the joints it drives). So building must open nothing — ports and devices
  open in ``connect`` — and the module must import in a fresh interpreter (installed, or on
  ``PYTHONPATH``): only a `RobotDescription` (the robot's name and its options, plain data)
  crosses to the control process.

Nothing registers itself on import: a new built-in is one more row in `ROBOTS`.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import msgspec

from servo.config import ConfigError, convert, doc, fields_of, is_sequence_type

from . import builtin
from .calibration import CalibrationError
from .protocol import Cameras, NoCameras, PoseSource, Robot, RobotParts, RobotSpec

RobotFactory = Callable[..., Robot | RobotParts]

#: Built-in robots. Adding one = one entry here, never an import side effect.
ROBOTS: dict[str, RobotFactory] = {
    "sim": builtin.sim,
    "so100": builtin.so100,
    "so101": builtin.so101,
    "ros2": builtin.ros2,
}

PLUGIN_FORM = "package.module:factory"


class RobotDescription(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Which robot to drive and with which options: what the edge hands its control process.

    Plain data (it crosses to the control process as JSON): the joints are built where they are
    driven, the cameras where frames are used, from the same description.
    """

    robot: Annotated[str, doc(f"A robot type of ROBOTS, or {PLUGIN_FORM}.")]
    options: Annotated[dict[str, Any], doc("Flat options (command-line text or typed TOML values).")] = {}

    def build(self) -> Robot:
        """The robot's joints (not connected).

        Raises:
            ConfigError: unknown robot, a plugin that cannot be used, bad option, or a
                combination the driver refuses.
            CalibrationError: a real arm's calibration file is missing or malformed.
        """
        return build_parts(self.robot, self.options).joints

    def build_cameras(self, poses: PoseSource) -> Cameras:
        """The robot's cameras (not connected); simulated ones render what ``poses`` publishes.

        Raises:
            ConfigError, CalibrationError: as `build`.
        """
        cameras = build_parts(self.robot, self.options).cameras
        return NoCameras() if cameras is None else cameras(poses)

    def spec(self) -> RobotSpec:
        """The robot's spec (building a driver opens nothing).

        Raises:
            ConfigError, CalibrationError: as `build`.
        """
        return self.build().spec


def robot_options(robot_type: str, options: Mapping[str, object] | None = None) -> msgspec.Struct | None:
    """Convert flat options (text from the command line, or typed TOML values) for one robot type.

    Returns None for a factory that takes no options (and was given none).

    Raises:
        ConfigError: unknown robot type, unusable plugin, unknown option or invalid value (one
            line, naming it).
    """
    kind = _options_type(robot_type, _factory(robot_type))
    given = dict(options or {})
    if kind is None:
        if given:
            raise ConfigError(f"robot {robot_type!r} takes no options, got {', '.join(sorted(given))}")
        return None
    fields = {f.name: f for f in msgspec.structs.fields(kind)}
    for name, value in given.items():
        # Lists are given comma-separated on the command line.
        if name in fields and isinstance(value, str) and is_sequence_type(fields[name].type):
            given[name] = [item.strip() for item in value.split(",")]
    return convert(given, kind, origin=f"robot {robot_type!r}", strict=False)


def build_parts(robot_type: str, options: Mapping[str, object] | None = None) -> RobotParts:
    """Call a robot's factory with its converted options.

    Raises:
        ConfigError: unknown robot type, unusable plugin, bad option, a factory that fails or
            returns something else than a `Robot` or `RobotParts`.
        CalibrationError: a real arm's calibration file is missing or malformed.
    """
    factory = _factory(robot_type)
    parsed = robot_options(robot_type, options)
    try:
        made = factory() if parsed is None else factory(parsed)
    except (ConfigError, CalibrationError):
        raise  # already one line saying what to fix
    except ValueError as exc:
        raise ConfigError(f"robot {robot_type!r}: {exc}") from None
    except Exception as exc:
        raise ConfigError(f"robot {robot_type!r} failed to build: {type(exc).__name__}: {exc}") from exc
    if isinstance(made, RobotParts):
        return made
    if isinstance(made, Robot):
        return RobotParts(made)
    raise ConfigError(
        f"robot {robot_type!r}: the factory returned {type(made).__name__}, not a Robot (spec, connect, "
        "disconnect, read_state, send_action) or RobotParts"
    )


def make_robot(robot_type: str, options: Mapping[str, object] | None = None) -> Robot:
    """Build a robot's joints by type name from flat options (see `build_parts`).

    Raises:
        ConfigError, CalibrationError: as `build_parts`.
    """
    return build_parts(robot_type, options).joints


def robot_summary(robot_type: str) -> str:
    """The first line of the robot factory's docstring.

    Raises:
        ConfigError: unknown robot type or unusable plugin.
    """
    doc = inspect.getdoc(_factory(robot_type)) or ""
    return doc.splitlines()[0] if doc else "(no description)"


def options_help(robot_type: str) -> list[str]:
    """One line per option of a robot type: ``name (type, default): description``.

    Raises:
        ConfigError: unknown robot type or unusable plugin.
    """
    kind = _options_type(robot_type, _factory(robot_type))
    lines = []
    for field in fields_of(kind) if kind is not None else ():
        default = "required" if field.required else f"default {field.default!r}"
        lines.append(f"{field.name} ({field.type_text}, {default}): {field.description}")
    return lines


def _factory(robot_type: str) -> RobotFactory:
    builtin_factory = ROBOTS.get(robot_type)
    if builtin_factory is not None:
        return builtin_factory
    module_name, sep, attr = robot_type.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"unknown robot type {robot_type!r}; valid types: {', '.join(sorted(ROBOTS))}, or {PLUGIN_FORM} (a plugin)"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"robot {robot_type!r}: cannot import {module_name!r} ({exc}); is it installed, or on PYTHONPATH?"
        ) from None
    except Exception as exc:
        raise ConfigError(
            f"robot {robot_type!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from None
    factory: RobotFactory | None = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(f"robot {robot_type!r}: {module_name!r} has no callable {attr!r}")
    return factory


def _options_type(robot_type: str, factory: RobotFactory) -> type[msgspec.Struct] | None:
    """The options Struct a factory declares (the annotation of its one parameter), or None."""
    try:
        parameters = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    if not parameters:
        return None
    if len(parameters) > 1 or parameters[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise ConfigError(
            f"robot {robot_type!r}: a robot factory takes one parameter, its options Struct; "
            f"this one takes ({', '.join(str(p) for p in parameters)})"
        )
    name = parameters[0].name
    try:
        annotation = typing.get_type_hints(factory).get(name)
    except Exception as exc:
        raise ConfigError(
            f"robot {robot_type!r}: cannot resolve the annotation of parameter {name!r}: {type(exc).__name__}: {exc}"
        ) from None
    if not (isinstance(annotation, type) and issubclass(annotation, msgspec.Struct)):
        raise ConfigError(
            f"robot {robot_type!r}: parameter {name!r} of the factory must be annotated with a msgspec.Struct "
            f"of options, got {annotation!r}"
        )
    return annotation
