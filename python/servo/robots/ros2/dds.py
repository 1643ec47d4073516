"""`DdsLink`: Cyclone DDS the way a ROS 2 node uses it (``rt/`` topics, ROS 2 type names, XCDR1, ROS 2 QoS).

No listener is ever installed: Cyclone's own threads (receive, discovery, lease) are C threads
that never take the GIL, so nothing here can stall the tick; data waits in each reader's history
until its owner takes it, and `DdsReader.wait` blocks in C (GIL released).

A participant joins the domain the way every ROS 2 node on Cyclone does: its configuration comes
from ``CYCLONEDDS_URI`` when set (`loopback_config` writes one that keeps a domain on this host,
unicast only, which the tests use so that concurrent runs never meet).
"""

from __future__ import annotations

from typing import Any

from cyclonedds.builtin import BuiltinDataReader, BuiltinTopicDcpsPublication, BuiltinTopicDcpsSubscription
from cyclonedds.core import ReadCondition, SampleState, WaitSet
from cyclonedds.domain import DomainParticipant
from cyclonedds.pub import DataWriter
from cyclonedds.qos import Policy, Qos
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic


def dds_topic(topic: str) -> str:
    """The DDS topic of a ROS 2 topic: ``rt`` + its fully qualified name (``rt/arm1/joint_states``)."""
    return "rt" + topic


class DdsReader:
    """A Cyclone reader (see `servo.robots.ros2.link.Reader`). Owned by the thread that takes from it."""

    def __init__(self, participant: DomainParticipant, reader: DataReader[Any]) -> None:
        self._reader = reader
        self._waitset: WaitSet | None = None
        self._participant = participant

    def take(self, n: int) -> list[Any]:
        """Up to ``n`` samples (instance-state notices included), oldest first; never waits."""
        return self._reader.take(N=n)

    def wait(self, timeout_s: float) -> bool:
        """Block in Cyclone (the GIL released) until a sample is there to take."""
        if self._waitset is None:
            self._waitset = WaitSet(self._participant)
            self._waitset.attach(ReadCondition(self._reader, SampleState.NotRead))
        return bool(self._waitset.wait(round(timeout_s * 1e9)))


class DdsWriter:
    """A Cyclone writer (see `servo.robots.ros2.link.Writer`). Owned by the thread that writes."""

    def __init__(self, writer: DataWriter[Any]) -> None:
        self._writer: Any = writer  # its status getters are untyped

    def write(self, message: Any) -> None:
        """Publish; a keep-last writer with ``max_blocking_time`` 0 never waits."""
        self._writer.write(message)

    def matched(self) -> bool:
        """Whether a reader with this topic, type and compatible QoS is matched."""
        return bool(self._writer.get_publication_matched_status().current_count > 0)


class DdsLink:
    """One DDS participant (see `servo.robots.ros2.link.Link`). Owned by the thread that opened it."""

    def __init__(self, domain_id: int) -> None:
        self._participant: DomainParticipant | None = DomainParticipant(domain_id)
        self._publications: BuiltinDataReader | None = None
        self._subscriptions: BuiltinDataReader | None = None

    def _owner(self) -> DomainParticipant:
        if self._participant is None:
            raise RuntimeError("the DDS link is closed")
        return self._participant

    def reader(self, topic: str, kind: type[Any], *, reliable: bool, depth: int = 1, waits: bool = False) -> DdsReader:
        """Keep-last ``depth``, volatile; XCDR1 or XCDR2, as the writer offers (any reader can wait)."""
        owner = self._owner()
        reliability = Policy.Reliability.Reliable(max_blocking_time=0) if reliable else Policy.Reliability.BestEffort
        qos = Qos(
            reliability,
            Policy.History.KeepLast(depth),
            Policy.Durability.Volatile,
            Policy.DataRepresentation(use_cdrv0_representation=True, use_xcdrv2_representation=True),
        )
        return DdsReader(owner, DataReader(owner, Topic(owner, dds_topic(topic), kind), qos=qos))

    def writer(self, topic: str, kind: type[Any], *, reliable: bool) -> DdsWriter:
        """Keep-last 1, volatile, XCDR1 (what ROS 2 readers expect); a write never waits.

        ``max_blocking_time`` 0 makes a write that would have to wait fail at once instead.
        """
        owner = self._owner()
        reliability = Policy.Reliability.Reliable(max_blocking_time=0) if reliable else Policy.Reliability.BestEffort
        qos = Qos(
            reliability,
            Policy.History.KeepLast(1),
            Policy.Durability.Volatile,
            Policy.DataRepresentation(use_cdrv0_representation=True),
        )
        return DdsWriter(DataWriter(owner, Topic(owner, dds_topic(topic), kind), qos=qos))

    def types(self, topic: str, *, published: bool) -> set[str]:
        """Type names of the publications (or subscriptions) on ``topic`` seen so far (DDS built-in topics)."""
        owner = self._owner()
        if self._publications is None or self._subscriptions is None:
            self._publications = BuiltinDataReader(owner, BuiltinTopicDcpsPublication)
            self._subscriptions = BuiltinDataReader(owner, BuiltinTopicDcpsSubscription)
        builtin = self._publications if published else self._subscriptions
        name = dds_topic(topic)
        return {s.type_name for s in builtin.read(N=1024) if getattr(s, "topic_name", None) == name}

    def close(self) -> None:
        """Delete the participant and everything in it now (remote nodes see its endpoints go at once).

        cyclonedds-python deletes an entity only in ``__del__``; calling it is how to do that before
        the garbage collector would.
        """
        if self._participant is not None:
            participant, self._participant = self._participant, None
            self._publications = self._subscriptions = None
            participant.__del__()


def loopback_config(*, max_participants: int = 32) -> str:
    """A ``CYCLONEDDS_URI`` value that keeps DDS on this host: loopback only, no multicast.

    Discovery is unicast to 127.0.0.1 over the first ``max_participants`` participant indices,
    so up to that many participants of one domain find each other and nothing leaves the host.
    """
    return (
        '<CycloneDDS><Domain Id="any"><General><Interfaces><NetworkInterface address="127.0.0.1"/></Interfaces>'
        "<AllowMulticast>false</AllowMulticast></General><Discovery><ParticipantIndex>auto</ParticipantIndex>"
        f"<MaxAutoParticipantIndex>{max_participants}</MaxAutoParticipantIndex>"
        '<Peers><Peer address="127.0.0.1"/></Peers></Discovery></Domain></CycloneDDS>'
    )
