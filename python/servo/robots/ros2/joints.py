"""A ROS 2 robot's joints, owned by the edge's control process (over DDS or rmw_zenoh's Zenoh).

JointState comes in; targets go out as a JointState, a Float64MultiArray or a one-point
JointTrajectory.

::

    created ──connect()──► waiting: the first state of every joint and a matched target
       │                   subscriber, within connect_timeout_s (a wrong type fails at once)
       │                        │ all there                     │ not in time / wrong type
       │                        ▼                               ▼
       │                    running ◄──fresh state──┐       ConnectionError, one line (nothing sent)
       │                        │ newest state older │
       │                        ▼ than state_timeout │
       │                 read_state raises RobotFault (the tick sends nothing)
       └──disconnect() (any state): the link and its endpoints are closed

The tick never waits: `read_state` takes what the reader holds (a non-blocking take) and
`send_action` writes one sample on a keep-last writer that cannot block.
"""

from __future__ import annotations

import time

import numpy as np

from servo.logs import get_logger

from ..protocol import FloatArray, RobotFault, RobotSpec
from .joint_cache import JointCache
from .link import Link, Reader, Writer, open_link, ros_type
from .messages import Duration, Float64MultiArray, JointState, JointTrajectory, JointTrajectoryPoint, Time
from .options import Ros2Setup

_log = get_logger(__name__)

#: How often `connect` looks at what arrived while it waits.
_POLL_S = 0.01
#: A failed write is logged again after this many more.
_WRITE_ERRORS_LOGGED = 1000
#: Samples the state reader keeps between two takes (several publishers may share the topic, e.g.
#: the arm and the gripper, at several times the tick rate).
STATE_DEPTH = 32
#: How often `connect` asks the graph which types the topics carry (a graph query can take a while).
_TYPE_CHECK_S = 0.25


class Ros2Joints:
    """The joints of a ROS 2 robot, implementing the `Robot` protocol (see the module docstring).

    Owned by the control loop's thread: `connect`, `read_state`, `send_action` and `disconnect`
    all come from it; the link is used by no other thread.
    """

    def __init__(self, setup: Ros2Setup) -> None:
        """Describe the robot; nothing is opened until `connect`."""
        self.setup = setup
        self._spec = setup.spec()
        self._cache = JointCache(setup.robot_names, setup.scale)
        self._unscale = 1.0 / np.asarray(setup.scale, dtype=np.float64)
        self._link: Link | None = None
        self._reader: Reader | None = None
        self._writer: Writer | None = None
        self._message = _command_message(setup)
        self.write_errors = 0
        self._log = _log.bind(robot="ros2", state_topic=setup.state_topic, command_topic=setup.command_topic)

    @property
    def spec(self) -> RobotSpec:
        """The robot as the policy sees it (its names, its units)."""
        return self._spec

    def connect(self) -> None:
        """Join the graph, then wait for every joint's state and a subscriber of the targets.

        Raises:
            ConnectionError: within ``connect_timeout_s`` a joint never appeared, nobody took the
                targets, or a node uses one of the topics with another message type (one line).
        """
        if self._link is not None:
            return
        setup = self.setup
        self._link = link = open_link(setup)
        try:
            self._reader = link.reader(setup.state_topic, JointState, reliable=setup.state_reliable, depth=STATE_DEPTH)
            self._writer = link.writer(setup.command_topic, type(self._message), reliable=setup.command_reliable)
            # Codecs build their machinery on first use (Cyclone's generic one): here, not in the first tick.
            self._message.serialize()
            JointState.deserialize(JointState(name=list(setup.robot_names)).serialize())
            self._wait_ready(link, self._reader, self._writer)
        except BaseException:
            self.disconnect()
            raise
        self._log.info("connected", transport=setup.transport, domain=setup.domain_id, joints=list(setup.robot_names))

    def _wait_ready(self, link: Link, reader: Reader, writer: Writer) -> None:
        deadline = time.monotonic() + self.setup.connect_timeout_s
        next_check = 0.0
        while True:
            self._take(reader, time.monotonic_ns())
            missing = self._cache.missing()
            subscribed = writer.matched()
            if not missing and subscribed:
                return
            problem = None
            if time.monotonic() >= next_check:
                problem = self._wrong_type(link)
                next_check = time.monotonic() + _TYPE_CHECK_S
            if problem is None and time.monotonic() >= deadline:
                problem = self._not_ready(missing, subscribed)
            if problem is not None:
                raise ConnectionError(f"ROS 2 robot: {problem}")
            time.sleep(_POLL_S)

    def _wrong_type(self, link: Link) -> str | None:
        setup = self.setup
        checks = (
            (setup.state_topic, True, JointState, "is published as", "state_topic"),
            (setup.command_topic, False, type(self._message), "is subscribed to as", "command_type"),
        )
        for topic, published, kind, how, option in checks:
            others = sorted(link.types(topic, published=published) - {kind.__idl_typename__})
            if others:
                theirs = ", ".join(ros_type(name) for name in others)
                return f"{topic} {how} {theirs}, not {ros_type(kind.__idl_typename__)} (check {option})"
        return None

    def _not_ready(self, missing: list[str], subscribed: bool) -> str:
        setup = self.setup
        waited = f"within {setup.connect_timeout_s:g} s"
        if missing and self._cache.last_names:
            have = ", ".join(self._cache.last_names)
            return f"{setup.state_topic} has no joint {', '.join(missing)} {waited} (it has {have}); check joints"
        if missing:
            return (
                f"no sensor_msgs/JointState on {setup.state_topic} {waited} ({setup.transport}, domain "
                f"{setup.domain_id}: is the driver running, with this ROS_DOMAIN_ID, and QoS state_qos it can serve?)"
            )
        assert not subscribed
        return (
            f"nobody subscribes to {setup.command_topic} as {setup.command_type} {waited} "
            "(check command_topic, command_type and command_qos)"
        )

    def disconnect(self) -> None:
        """Leave the graph (close the link and its endpoints). Idempotent."""
        if self._link is None:
            return
        link, self._link = self._link, None
        self._reader = self._writer = None
        link.close()
        self._log.info("disconnected")

    def _take(self, reader: Reader, now_ns: int) -> None:
        # No link gives a reception time (DDS only the sender's clock): a sample counts from the
        # take that returned it, at most one tick after it arrived.
        for sample in reader.take(STATE_DEPTH):
            if isinstance(sample, JointState):
                self._cache.update(sample.name, sample.position, now_ns)

    def read_state(self) -> FloatArray:
        """The newest joint positions in the policy's units and order, without waiting.

        Raises:
            RobotFault: a joint's newest value is older than ``state_timeout_s`` (the driver
                stopped publishing, or the link dropped). Ages run from the take that first saw
                a value, so the fault comes at most one control period after the bound.
        """
        now = time.monotonic_ns()
        assert self._reader is not None, "read_state before connect"
        self._take(self._reader, now)
        joint, age = self._cache.stalest(now)
        if age > self.setup.state_timeout_s:
            raise RobotFault(
                f"joint states stopped arriving: {joint} not updated for {age:.2f} s "
                f"(state_timeout_s {self.setup.state_timeout_s:g})"
            )
        return self._cache.state()

    def send_action(self, target: FloatArray) -> None:
        """Publish the target (already checked and limited by the edge) in ROS units; never blocks.

        A write DDS refuses (it would have to wait) is counted and logged, not raised: the robot
        keeps its previous target, and the next tick sends a new one.
        """
        values = (np.asarray(target, dtype=np.float64) * self._unscale).tolist()
        message = _fill(self._message, values, self.setup)
        assert self._writer is not None, "send_action before connect"
        try:
            self._writer.write(message)
        except Exception as exc:
            self.write_errors += 1
            if self.write_errors % _WRITE_ERRORS_LOGGED == 1:
                self._log.warning("target not sent", error=str(exc), write_errors=self.write_errors)


def _command_message(setup: Ros2Setup) -> JointState | Float64MultiArray | JointTrajectory:
    """The message object every target is written into (refilled, never reallocated)."""
    names = list(setup.robot_names)
    if setup.command_type == "std_msgs/Float64MultiArray":
        return Float64MultiArray()
    if setup.command_type == "trajectory_msgs/JointTrajectory":
        seconds, nanos = divmod(round(setup.trajectory_time_s * 1e9), 1_000_000_000)
        # A zero header stamp tells joint_trajectory_controller to start the trajectory now.
        point = JointTrajectoryPoint(time_from_start=Duration(seconds, nanos))
        return JointTrajectory(joint_names=names, points=[point])
    return JointState(name=names)


def _fill(
    message: JointState | Float64MultiArray | JointTrajectory, values: list[float], setup: Ros2Setup
) -> JointState | Float64MultiArray | JointTrajectory:
    if isinstance(message, Float64MultiArray):
        message.data = [values[i] for i in setup.command_order]
    elif isinstance(message, JointTrajectory):
        message.points[0].positions = values
    else:
        seconds, nanos = divmod(time.time_ns(), 1_000_000_000)
        message.header.stamp = Time(seconds, nanos)  # the edge's ROS clock: its wall clock
        message.position = values
    return message
