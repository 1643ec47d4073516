"""`ZenohLink`: ROS 2 topics the way rmw_zenoh carries them, from its design document (docs/design.md).

* Key expression of a topic: ``<domain_id>/<fully qualified name without its leading />/<DDS type
  name>/<type hash>``, e.g. ``0/arm1/joint_states/sensor_msgs::msg::dds_::JointState_/RIHS01_…``;
  the type hash is REP-2016's RIHS01 (`servo.robots.ros2.messages.TYPE_HASHES`).
* Payload: the message's CDR, as on DDS.
* Attachment of every publication: the sequence number (int64 LE), the source timestamp (ns since
  the UNIX epoch, int64 LE), the length of the publisher GID (one byte, 16), the GID (16 bytes).
* The graph: every node's entity has a liveliness token
  ``@ros2_lv/<domain>/<session>/<node>/<entity>/<kind>/<enclave>/<namespace>/<node name>/<topic>/<type>/<hash>/<qos>``
  (kinds ``MP`` publisher, ``MS`` subscription; ``/`` in names mangled to ``%``). servo reads them to
  say which type another node uses a topic as; it declares none of its own, because the ``<qos>``
  part is not specified by the design document (it points at rmw_zenoh's ``qos_to_keyexpr``): servo's
  endpoints exchange data with ROS nodes but do not show in ``ros2 topic info``.

The session is a Zenoh client of the rmw_zenoh router (``ros2 run rmw_zenoh_cpp rmw_zenohd``,
``tcp/localhost:7447`` by default), multicast scouting off. Readers of the tick keep samples in
a Zenoh ring channel (filled by Zenoh's own threads in Rust: no Python runs when data arrives);
a camera reader hands samples to its capture thread through a deposit-only callback.
"""

from __future__ import annotations

import secrets
import struct
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import zenoh
from zenoh.handlers import RingChannel

from servo.logs import get_logger
from servo.transport.config import ZenohSettings

from .messages import TYPE_HASHES

_log = get_logger(__name__)

ADMIN_SPACE = "@ros2_lv"
#: sequence number, source timestamp, GID length, GID (design.md, "Publishers").
ATTACHMENT = struct.Struct("<qqB16s")
GID_BYTES = 16
#: How long a graph query waits for the tokens to come in.
_GRAPH_TIMEOUT_S = 0.5
#: Token fields: kind, mangled topic and type name sit at these places.
_KIND, _TOPIC, _TYPE = 5, 9, 10


def key_expr(domain_id: int, topic: str, type_name: str, type_hash: str) -> str:
    """The key expression of ``topic`` (a fully qualified ROS name) carrying ``type_name``."""
    return f"{domain_id}/{topic.lstrip('/')}/{type_name}/{type_hash}"


def topic_key(domain_id: int, topic: str, kind: type[Any]) -> str:
    """The key expression of ``topic`` carrying the message class ``kind``."""
    type_name: str = kind.__idl_typename__
    return key_expr(domain_id, topic, type_name, TYPE_HASHES[type_name])


def attachment(sequence: int, timestamp_ns: int, gid: bytes) -> bytes:
    """The attachment of one publication."""
    return ATTACHMENT.pack(sequence, timestamp_ns, GID_BYTES, gid)


def mangle(name: str) -> str:
    """A name as liveliness tokens carry it: ``/`` -> ``%`` (an empty one is ``%``)."""
    return name.replace("/", "%") or "%"


def entity_token(
    domain_id: int, session_id: str, entity_id: int, kind: str, node: str, topic: str, type_hash: str, qos: str
) -> str:
    """The liveliness token of a node's publisher or subscription.

    Args:
        domain_id: The ROS domain.
        session_id: The Zenoh session id of the node's context.
        entity_id: The entity's id within its node (the node's id is 0).
        kind: ``MP`` (publisher) or ``MS`` (subscription).
        node: The node's fully qualified name, e.g. ``/arm1/driver``.
        topic: ``fully_qualified_topic_name:dds_type_name``.
        type_hash: The type's RIHS01 hash.
        qos: The ``<qos>`` part (not specified by design.md; servo never parses it).
    """
    namespace, _, name = node.rpartition("/")
    topic_name, _, type_name = topic.partition(":")
    names = f"%/{mangle(namespace)}/{name}/{mangle(topic_name)}/{type_name}/{type_hash}"
    return f"{ADMIN_SPACE}/{domain_id}/{session_id}/0/{entity_id}/{kind}/{names}/{qos}"


class ZenohReader:
    """A subscriber's newest samples, decoded on take. Owned by the thread that takes from it."""

    def __init__(self, session: zenoh.Session, key: str, kind: type[Any], depth: int, *, notify: bool) -> None:
        self._kind = kind
        self.malformed = 0
        self._cond: threading.Condition | None = None
        self._ring: deque[zenoh.Sample] | None = None
        if notify:
            # A camera's capture thread waits for frames: a deposit-only callback wakes it.
            self._cond, self._ring = threading.Condition(), deque(maxlen=depth)
            self._subscriber: Any = session.declare_subscriber(key, self._deposit)
        else:
            self._subscriber = session.declare_subscriber(key, RingChannel(depth))

    def _deposit(self, sample: zenoh.Sample) -> None:
        assert self._cond is not None
        assert self._ring is not None
        with self._cond:
            self._ring.append(sample)
            self._cond.notify()

    def _next(self) -> zenoh.Sample | None:
        if self._ring is None:
            sample: zenoh.Sample | None = self._subscriber.try_recv()
            return sample
        assert self._cond is not None
        with self._cond:
            return self._ring.popleft() if self._ring else None

    def take(self, n: int) -> list[Any]:
        """Up to ``n`` messages, oldest first; a payload that is not CDR of the type is dropped (counted)."""
        out: list[Any] = []
        while len(out) < n and (sample := self._next()) is not None:
            try:
                out.append(self._kind.deserialize(sample.payload.to_bytes()))
            except Exception:  # the bytes come from the network: any decoding failure is theirs
                self.malformed += 1
                if self.malformed in (1, 100) or self.malformed % 1000 == 0:
                    _log.warning("malformed ROS 2 message dropped", key=str(sample.key_expr), dropped=self.malformed)
        return out

    def wait(self, timeout_s: float) -> bool:
        """Block until a sample is there (camera readers only)."""
        if self._cond is None or self._ring is None:
            raise RuntimeError("wait() needs a reader made with waits=True")
        with self._cond:
            return self._cond.wait_for(lambda: bool(self._ring), timeout_s)


class ZenohWriter:
    """A publisher with rmw_zenoh's attachment. Owned by the thread that writes."""

    def __init__(self, session: zenoh.Session, key: str, *, reliable: bool) -> None:
        self._publisher = session.declare_publisher(
            key,
            congestion_control=zenoh.CongestionControl.DROP,  # never block the tick
            reliability=zenoh.Reliability.RELIABLE if reliable else zenoh.Reliability.BEST_EFFORT,
            express=True,
        )
        self._gid = secrets.token_bytes(GID_BYTES)
        self._sequence = 0

    def write(self, message: Any) -> None:
        """Publish ``message`` with the next sequence number, stamped on this host's wall clock."""
        self._sequence += 1
        self._publisher.put(message.serialize(), attachment=attachment(self._sequence, time.time_ns(), self._gid))

    def matched(self) -> bool:
        """Whether a subscriber of this key expression (topic and type) is there."""
        return bool(self._publisher.matching_status)


class ZenohLink:
    """One Zenoh session in the ROS 2 graph of one domain (see the module docstring).

    Owned by the thread that opened it; its readers and writers by the threads that use them.
    """

    def __init__(self, domain_id: int, connect: Sequence[str]) -> None:
        self.domain_id = domain_id
        settings = ZenohSettings(mode="client", connect=list(connect), shared_memory=False)
        self._session: zenoh.Session | None = zenoh.open(settings.to_config())

    def _open(self) -> zenoh.Session:
        if self._session is None:
            raise RuntimeError("the Zenoh link is closed")
        return self._session

    @property
    def session(self) -> zenoh.Session:
        """The Zenoh session (to declare more, e.g. the liveliness tokens of a simulated node)."""
        return self._open()

    def reader(
        self, topic: str, kind: type[Any], *, reliable: bool, depth: int = 1, waits: bool = False
    ) -> ZenohReader:
        """A subscriber keeping the newest ``depth`` samples (reliability is the publisher's choice).

        With ``waits`` its `ZenohReader.wait` works (a callback deposits the samples: for a capture
        thread); without, a ring channel holds them and no Python runs when they arrive.
        """
        return ZenohReader(self._open(), topic_key(self.domain_id, topic, kind), kind, depth, notify=waits)

    def writer(self, topic: str, kind: type[Any], *, reliable: bool) -> ZenohWriter:
        """A publisher of ``topic`` that drops rather than blocks when the link is congested."""
        return ZenohWriter(self._open(), topic_key(self.domain_id, topic, kind), reliable=reliable)

    def types(self, topic: str, *, published: bool) -> set[str]:
        """Type names of the nodes' publishers (``MP``) or subscriptions (``MS``) on ``topic``."""
        wanted, mangled = ("MP" if published else "MS"), mangle(topic)
        found = set()
        replies = self._open().liveliness().get(f"{ADMIN_SPACE}/{self.domain_id}/**", timeout=_GRAPH_TIMEOUT_S)
        for reply in replies:
            if reply.ok is None:
                continue
            fields = str(reply.ok.key_expr).split("/")
            if len(fields) > _TYPE and fields[_KIND] == wanted and fields[_TOPIC] == mangled:
                found.add(fields[_TYPE])
        return found

    def close(self) -> None:
        """Close the session (its subscribers and publishers go with it). Idempotent."""
        if self._session is not None:
            session, self._session = self._session, None
            session.close()
