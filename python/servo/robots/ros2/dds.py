"""Cyclone DDS the way a ROS 2 node uses it: ``rt/`` topics, ROS 2 type names, XCDR1, ROS 2 QoS.

Only the thread that owns an entity uses it (the control process's tick for the joints, each
camera's capture thread for its reader). No listener is ever installed: Cyclone's own threads
(receive, discovery, lease) are C threads that never take the GIL, so nothing here can stall the
tick; data waits in each reader's history until its owner takes it.

A participant joins the domain the way every ROS 2 node on Cyclone does: its configuration comes
from ``CYCLONEDDS_URI`` when set (`loopback_config` writes one that keeps a domain on this host,
unicast only, which the tests use so that concurrent runs never meet).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cyclonedds.builtin import BuiltinDataReader, BuiltinTopicDcpsPublication, BuiltinTopicDcpsSubscription
from cyclonedds.domain import DomainParticipant
from cyclonedds.idl import IdlStruct
from cyclonedds.pub import DataWriter
from cyclonedds.qos import Policy, Qos
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic

#: Samples a state reader keeps between two takes (several publishers may share the topic, e.g.
#: the arm and the gripper, at several times the tick rate).
STATE_DEPTH = 32


def ros_type(dds_type: str) -> str:
    """``pkg/msg/Name`` of a DDS type name such as ``pkg::msg::dds_::Name_`` (other names unchanged)."""
    package, sep, rest = dds_type.partition("::msg::dds_::")
    return f"{package}/msg/{rest.removesuffix('_')}" if sep else dds_type


def ros_topic(dds_topic: str) -> str:
    """The ROS 2 name of a DDS topic (``rt/joint_states`` -> ``/joint_states``)."""
    return dds_topic.removeprefix("rt")


def participant(domain_id: int) -> DomainParticipant:
    """A participant in ``domain_id`` (configured by ``CYCLONEDDS_URI``, like a ROS 2 node on Cyclone)."""
    return DomainParticipant(domain_id)


def reader(
    owner: DomainParticipant, topic: str, kind: type[IdlStruct], *, reliable: bool, depth: int = 1
) -> DataReader[Any]:
    """A reader keeping the newest ``depth`` samples (volatile; XCDR1 or XCDR2, as the writer offers)."""
    reliability = Policy.Reliability.Reliable(max_blocking_time=0) if reliable else Policy.Reliability.BestEffort
    qos = Qos(
        reliability,
        Policy.History.KeepLast(depth),
        Policy.Durability.Volatile,
        Policy.DataRepresentation(use_cdrv0_representation=True, use_xcdrv2_representation=True),
    )
    return DataReader(owner, Topic(owner, topic, kind), qos=qos)


def writer(owner: DomainParticipant, topic: str, kind: type[IdlStruct], *, reliable: bool) -> DataWriter[Any]:
    """A writer that never blocks: keep-last 1 (an unacknowledged target is replaced by the next), XCDR1.

    ``max_blocking_time`` 0 makes a write that would have to wait fail at once instead.
    """
    reliability = Policy.Reliability.Reliable(max_blocking_time=0) if reliable else Policy.Reliability.BestEffort
    qos = Qos(
        reliability,
        Policy.History.KeepLast(1),
        Policy.Durability.Volatile,
        Policy.DataRepresentation(use_cdrv0_representation=True),
    )
    return DataWriter(owner, Topic(owner, topic, kind), qos=qos)


@dataclass(frozen=True)
class Endpoint:
    """A publication or subscription seen in the domain: its topic and DDS type name. Immutable."""

    topic: str
    type_name: str


class Discovery:
    """What the domain publishes and subscribes to (DDS built-in topics), for start-up diagnostics.

    Owned by the thread that connects the robot; used only before the first tick.
    """

    def __init__(self, owner: DomainParticipant) -> None:
        self._publications = BuiltinDataReader(owner, BuiltinTopicDcpsPublication)
        self._subscriptions = BuiltinDataReader(owner, BuiltinTopicDcpsSubscription)

    def publications(self, topic: str) -> set[Endpoint]:
        """Publications on ``topic`` seen so far (ours included)."""
        return self._on(self._publications, topic)

    def subscriptions(self, topic: str) -> set[Endpoint]:
        """Subscriptions to ``topic`` seen so far (ours included)."""
        return self._on(self._subscriptions, topic)

    @staticmethod
    def _on(builtin: BuiltinDataReader, topic: str) -> set[Endpoint]:
        found = set()
        for sample in builtin.read(N=1024):
            if getattr(sample, "topic_name", None) == topic:
                found.add(Endpoint(sample.topic_name, sample.type_name))
        return found


def close(entity: DomainParticipant) -> None:
    """Delete a participant and everything in it now (remote nodes see its endpoints go at once).

    cyclonedds-python deletes an entity only in ``__del__``; calling it is how to do that before
    the garbage collector would.
    """
    entity.__del__()


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
