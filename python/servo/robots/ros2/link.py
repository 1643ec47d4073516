"""How the ROS 2 robot reaches the ROS graph: a `Link` of readers and writers on ROS topic names.

Two links speak the wire formats ROS 2 nodes use: `servo.robots.ros2.dds.DdsLink` (DDS/RTPS with
Cyclone DDS: what rmw_cyclonedds and rmw_fastrtps nodes exchange) and
`servo.robots.ros2.rmw_zenoh.ZenohLink` (rmw_zenoh's key expressions and attachments over Zenoh).
Both carry the same CDR messages (`servo.robots.ros2.messages`). Topics are ROS 2 fully qualified
names (``/arm1/joint_states``); each link maps them onto its own wire names.

A link and everything it made belong to one thread at a time (the control process's tick, or
one camera's capture thread per reader). Readers made for the tick never run Python code on a
thread of their own when data arrives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .options import Ros2Setup


class Reader(Protocol):
    """The newest messages of one topic, kept until taken."""

    def take(self, n: int) -> list[Any]:
        """Up to ``n`` messages received since the last take, oldest first; never waits.

        Other objects than messages of the reader's type may be in the list (DDS hands out
        instance-state notices): callers keep what they expect.
        """
        ...

    def wait(self, timeout_s: float) -> bool:
        """Block until there is something to take, or ``timeout_s``; True if there is."""
        ...


class Writer(Protocol):
    """Publishes one topic; a write never blocks."""

    def write(self, message: Any) -> None:
        """Publish ``message`` (the writer's type).

        Raises:
            Exception: the link refused it (the caller counts and goes on).
        """
        ...

    def matched(self) -> bool:
        """Whether a subscriber of this topic and type is there."""
        ...


class Link(Protocol):
    """Readers and writers on ROS topics, and what the graph holds (for start-up diagnostics)."""

    def reader(self, topic: str, kind: type[Any], *, reliable: bool, depth: int = 1, waits: bool = False) -> Reader:
        """A reader of ``topic`` (a fully qualified ROS name) keeping the newest ``depth`` messages.

        ``waits``: its owner will block in `Reader.wait` (a capture thread), not only take.
        """
        ...

    def writer(self, topic: str, kind: type[Any], *, reliable: bool) -> Writer:
        """A writer of ``topic`` (keep-last 1: an unsent target is replaced by the next)."""
        ...

    def types(self, topic: str, *, published: bool) -> set[str]:
        """DDS type names (``pkg::msg::dds_::Name_``) other nodes publish (or subscribe to) ``topic`` as."""
        ...

    def close(self) -> None:
        """Leave the graph: every reader and writer of the link goes with it. Idempotent."""
        ...


def open_link(setup: Ros2Setup) -> Link:
    """The link ``setup.transport`` names, joined to its domain."""
    if setup.transport == "zenoh":
        from .rmw_zenoh import ZenohLink

        return ZenohLink(setup.domain_id, setup.zenoh_connect)
    from .dds import DdsLink

    return DdsLink(setup.domain_id)


def ros_type(dds_type: str) -> str:
    """``pkg/msg/Name`` of a DDS type name such as ``pkg::msg::dds_::Name_`` (other names unchanged)."""
    package, sep, rest = dds_type.partition("::msg::dds_::")
    return f"{package}/msg/{rest.removesuffix('_')}" if sep else dds_type
