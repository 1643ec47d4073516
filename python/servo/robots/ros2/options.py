"""``--robot ros2`` options, and what they resolve to: names, units, limits, topics (no DDS here).

The policy sees the robot through its own joint names, in its own order, in its own units; the
ROS side speaks the robot's joint names in SI units (REP 103: rad, m). ``joints`` maps one onto
the other (``POLICY_NAME=ROBOT_JOINT``), ``units`` says what the policy sees per joint
(``radians`` and ``meters`` pass through, ``degrees`` converts, ``raw`` passes a non-SI value
through undeclared), and every limit is given in ROS units (the URDF's, or options that override
it) and converted once here.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec

from servo.config import FieldError, Hertz, Seconds, doc

from ..camera_list import parse_cameras
from ..protocol import CameraSpec, RobotSpec
from .urdf import JointLimit, UrdfError, joint_limits

Unit = Literal["radians", "degrees", "meters", "raw"]
CommandType = Literal["sensor_msgs/JointState", "std_msgs/Float64MultiArray", "trajectory_msgs/JointTrajectory"]
Reliability = Literal["best_effort", "reliable"]
Transport = Literal["dds", "zenoh"]

#: Policy units per ROS unit. ``raw`` passes a value that is not SI (a gripper's 0..1, a driver's
#: own scale) through as it is, and leaves it out of the session's unit check.
SCALE: dict[str, float] = {"radians": 1.0, "degrees": 180.0 / math.pi, "meters": 1.0, "raw": 1.0}
#: ROS 2 domain ids that map onto valid DDS ports (the RTPS port formula).
MAX_DOMAIN_ID = 232
DomainId = Annotated[int, msgspec.Meta(ge=0, le=MAX_DOMAIN_ID)]
_NAME = re.compile(r"/?[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*")
_COMPRESSED = "/compressed"


class Ros2Options(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Options of a ROS 2 robot over DDS (``--robot ros2``); every limit is in ROS units (rad, m)."""

    joints: Annotated[
        tuple[str, ...],
        doc("The policy's joints in its order: POLICY_NAME=ROBOT_JOINT, or ROBOT_JOINT if the same.", min_length=1),
    ]
    rest_pose: Annotated[tuple[float, ...], doc("Where to park, one value per joint in the policy's order (rad, m).")]
    urdf: Annotated[
        str, doc("URDF file whose <limit lower upper velocity> bound the joints (or give lower, upper, max_velocity).")
    ] = ""
    lower: Annotated[tuple[float, ...] | None, doc("Lower position limits (overrides the URDF).")] = None
    upper: Annotated[tuple[float, ...] | None, doc("Upper position limits (overrides the URDF).")] = None
    max_velocity: Annotated[tuple[float, ...] | None, doc("Speed limits per second (overrides the URDF).")] = None
    units: Annotated[
        tuple[Unit, ...], doc("What the policy sees: radians, degrees, meters or raw; one for all or one per joint.")
    ] = ("radians",)
    state_topic: Annotated[str, doc("sensor_msgs/JointState topic the robot publishes.")] = "joint_states"
    command_topic: Annotated[str, doc("Topic the targets are published on.")] = "target_joints"
    command_type: Annotated[CommandType, doc("Message type of the targets.")] = "sensor_msgs/JointState"
    command_joints: Annotated[
        tuple[str, ...], doc("Float64MultiArray: the robot joints in the order of its values (default: joints').")
    ] = ()
    trajectory_time_s: Annotated[
        Seconds | None,
        doc("JointTrajectory: time_from_start of its one point (default: one control period)."),
    ] = None
    namespace: Annotated[str, doc("ROS namespace of relative topic names, e.g. /arm1.")] = ""
    transport: Annotated[
        Transport, doc("dds (Cyclone DDS: rmw_cyclonedds, rmw_fastrtps nodes) or zenoh (rmw_zenoh, via its router).")
    ] = "dds"
    zenoh_connect: Annotated[tuple[str, ...], doc("transport=zenoh: the rmw_zenoh router's endpoint(s).")] = (
        "tcp/localhost:7447",
    )
    domain_id: Annotated[DomainId | None, doc("DDS domain (ROS_DOMAIN_ID); default $ROS_DOMAIN_ID, else 0.")] = None
    state_qos: Annotated[Reliability, doc("Reliability of the joint-state reader (sensor data: best_effort).")] = (
        "best_effort"
    )
    command_qos: Annotated[Reliability, doc("Reliability of the target writer.")] = "reliable"
    fps: Annotated[Hertz, doc("Control rate (Hz).")] = 30.0
    state_timeout_s: Annotated[
        Seconds, doc("A joint state older than this (edge's clock) is a robot fault: no command.")
    ] = 0.2
    connect_timeout_s: Annotated[
        Seconds, doc("How long the start waits for every joint, a target subscriber and each camera.")
    ] = 5.0
    cameras: Annotated[
        str, doc("Image topics NAME:TOPIC:WxH[@FPS], e.g. 'front:/cam/image_raw:640x480'; …/compressed: jpeg.")
    ] = ""

    def check(self) -> None:
        """Names, lengths, limits (the URDF is read) and topics; see `resolve`."""
        resolve(self)


@dataclass(frozen=True)
class CameraTopic:
    """One camera: its name for the policy, its ROS topic, whether frames are JPEG, its size. Immutable."""

    name: str
    topic: str
    compressed: bool
    spec: CameraSpec


@dataclass(frozen=True)
class Ros2Setup:
    """The options resolved: everything the joints and the cameras need, as plain data. Immutable.

    Vectors are in the policy's joint order; ``scale`` turns ROS values into policy values
    (``policy = ros * scale``); limits and the rest pose are already in policy units.
    """

    policy_names: tuple[str, ...]
    robot_names: tuple[str, ...]
    units: tuple[str, ...]
    scale: tuple[float, ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    max_velocity: tuple[float, ...]
    rest_pose: tuple[float, ...]
    state_topic: str
    command_topic: str
    command_type: CommandType
    command_order: tuple[int, ...]
    trajectory_time_s: float
    transport: Transport
    zenoh_connect: tuple[str, ...]
    domain_id: int
    state_reliable: bool
    command_reliable: bool
    fps: float
    state_timeout_s: float
    connect_timeout_s: float
    cameras: tuple[CameraTopic, ...]

    def spec(self) -> RobotSpec:
        """The robot's spec, as the edge and the server see it."""
        return RobotSpec(
            name="ros2",
            fps=self.fps,
            joint_names=self.policy_names,
            cameras={camera.name: camera.spec for camera in self.cameras},
            lower=self.lower,
            upper=self.upper,
            max_velocity=self.max_velocity,
            rest_pose=self.rest_pose,
            extra={"state_topic": self.state_topic, "command_topic": self.command_topic, "domain": str(self.domain_id)},
            # raw values are the driver's own: the session states no unit for them.
            units=tuple("" if unit == "raw" else unit for unit in self.units),
        )


def ros_name(name: str, namespace: str, option: str) -> str:
    """The fully qualified name of a ROS 2 topic: relative names are in ``namespace`` (``/ns/joint_states``).

    Raises:
        FieldError: not a valid ROS 2 topic name (private ``~`` names included: there is no node).
    """
    if not _NAME.fullmatch(name):
        raise FieldError(option, f"{name!r} is not a ROS 2 topic name (letters, digits, _ and /)")
    if not name.startswith("/"):
        inner = namespace.strip("/")
        if inner and not _NAME.fullmatch(inner):
            raise FieldError("namespace", f"{namespace!r} is not a ROS 2 namespace")
        name = f"/{inner}/{name}" if inner else f"/{name}"
    return name


def resolve(options: Ros2Options) -> Ros2Setup:
    """Check the options and resolve them (reads the URDF, if any).

    Raises:
        FieldError: the option at fault, and why.
    """
    policy_names, robot_names = _joint_names(options.joints)
    n = len(policy_names)
    units = options.units * n if len(options.units) == 1 else options.units
    _require_length("units", units, n, "one, or one per joint")
    _require_length("rest_pose", options.rest_pose, n)
    limits = _limits(options, robot_names)
    scale = tuple(SCALE[unit] for unit in units)
    for name, rest, limit in zip(robot_names, options.rest_pose, limits, strict=True):
        if not limit.lower <= rest <= limit.upper:
            raise FieldError("rest_pose", f"{rest} is outside {name}'s limits {limit.lower}..{limit.upper}")
    return Ros2Setup(
        policy_names=policy_names,
        robot_names=robot_names,
        units=units,
        scale=scale,
        lower=tuple(limit.lower * s for limit, s in zip(limits, scale, strict=True)),
        upper=tuple(limit.upper * s for limit, s in zip(limits, scale, strict=True)),
        max_velocity=tuple(limit.velocity * s for limit, s in zip(limits, scale, strict=True)),
        rest_pose=tuple(value * s for value, s in zip(options.rest_pose, scale, strict=True)),
        state_topic=ros_name(options.state_topic, options.namespace, "state_topic"),
        command_topic=ros_name(options.command_topic, options.namespace, "command_topic"),
        command_type=options.command_type,
        command_order=_command_order(options, robot_names),
        trajectory_time_s=options.trajectory_time_s or 1.0 / options.fps,
        transport=options.transport,
        zenoh_connect=_endpoints(options),
        domain_id=_domain_id(options.domain_id),
        state_reliable=options.state_qos == "reliable",
        command_reliable=options.command_qos == "reliable",
        fps=options.fps,
        state_timeout_s=options.state_timeout_s,
        connect_timeout_s=options.connect_timeout_s,
        cameras=_cameras(options),
    )


def _joint_names(items: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    policy, robot = [], []
    for item in items:
        mine, sep, theirs = (part.strip() for part in item.partition("="))
        if not mine or (sep and not theirs):
            raise FieldError("joints", f"{item!r} is not POLICY_NAME=ROBOT_JOINT or ROBOT_JOINT")
        policy.append(mine)
        robot.append(theirs or mine)
    for what, names in (("policy", policy), ("robot", robot)):
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise FieldError("joints", f"{what} joint name(s) {', '.join(repeated)} appear more than once")
    return tuple(policy), tuple(robot)


def _require_length(option: str, values: tuple[object, ...], n: int, what: str = "one per joint") -> None:
    if len(values) != n:
        raise FieldError(option, f"has {len(values)} values, needs {what} ({n} joints)")


def _limits(options: Ros2Options, robot_names: tuple[str, ...]) -> list[JointLimit]:
    n = len(robot_names)
    given = {"lower": options.lower, "upper": options.upper, "max_velocity": options.max_velocity}
    for option, values in given.items():
        if values is not None:
            _require_length(option, values, n)
    if not options.urdf and any(values is None for values in given.values()):
        missing = ", ".join(option for option, values in given.items() if values is None)
        raise FieldError("urdf", f"servo needs every joint's limits: give urdf=FILE, or {missing}")
    from_urdf: dict[str, JointLimit] = {}
    if options.urdf:
        try:
            from_urdf = joint_limits(options.urdf, robot_names)
        except UrdfError as exc:
            raise FieldError("urdf", str(exc)) from None
    limits = []
    for i, name in enumerate(robot_names):
        base = from_urdf.get(name)
        lower = options.lower[i] if options.lower is not None else base.lower if base else math.nan
        upper = options.upper[i] if options.upper is not None else base.upper if base else math.nan
        velocity = options.max_velocity[i] if options.max_velocity is not None else base.velocity if base else 0.0
        if not (math.isfinite(lower) and math.isfinite(upper)):
            raise FieldError("lower", f"{name} has no finite range (a continuous joint?): give lower and upper")
        if not lower < upper:
            raise FieldError("lower", f"{name}: lower {lower} is not below upper {upper}")
        if not (math.isfinite(velocity) and velocity > 0):
            raise FieldError("max_velocity", f"{name}: {velocity} is not a positive speed")
        limits.append(JointLimit(lower, upper, velocity))
    return limits


def _command_order(options: Ros2Options, robot_names: tuple[str, ...]) -> tuple[int, ...]:
    if not options.command_joints:
        return tuple(range(len(robot_names)))
    if options.command_type != "std_msgs/Float64MultiArray":
        raise FieldError("command_joints", "orders a Float64MultiArray's values; the other types name their joints")
    if sorted(options.command_joints) != sorted(robot_names):
        raise FieldError("command_joints", f"must hold each of the joints once: {', '.join(robot_names)}")
    return tuple(robot_names.index(name) for name in options.command_joints)


def _endpoints(options: Ros2Options) -> tuple[str, ...]:
    for i, endpoint in enumerate(options.zenoh_connect):
        protocol, sep, address = endpoint.partition("/")
        if not sep or not protocol or not address:
            raise FieldError(f"zenoh_connect[{i}]", "not an endpoint like 'tcp/localhost:7447'")
    if options.transport == "zenoh" and not options.zenoh_connect:
        raise FieldError("zenoh_connect", "transport=zenoh needs the rmw_zenoh router's endpoint")
    return options.zenoh_connect


def _domain_id(given: int | None) -> int:
    if given is not None:
        return given
    text = os.environ.get("ROS_DOMAIN_ID", "").strip()
    if not text:
        return 0
    if not text.isdigit() or int(text) > MAX_DOMAIN_ID:
        raise FieldError("domain_id", f"ROS_DOMAIN_ID={text!r} is not a domain id (0..{MAX_DOMAIN_ID})")
    return int(text)


def _cameras(options: Ros2Options) -> tuple[CameraTopic, ...]:
    try:
        entries = parse_cameras(options.cameras)
    except ValueError as exc:
        raise FieldError("cameras", str(exc)) from None
    cameras = []
    for entry in entries:
        if not isinstance(entry.source, str) or entry.width is None or entry.height is None:
            raise FieldError("cameras", f"camera {entry.name!r} needs a topic and a size: NAME:TOPIC:WxH")
        topic = ros_name(entry.source, options.namespace, "cameras")
        spec = CameraSpec(height=entry.height, width=entry.width, fps=entry.fps or 30.0)
        cameras.append(CameraTopic(entry.name, topic, entry.source.endswith(_COMPRESSED), spec))
    return tuple(cameras)
