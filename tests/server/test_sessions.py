"""The session registry on its own: newest-wins mailboxes through the decode stage."""

from __future__ import annotations

import secrets
import threading
from typing import Any

import numpy as np

from servo._core import (
    FLAG_EPISODE_START,
    MSG_CHUNK,
    MSG_DRAIN,
    MSG_ERROR,
    MSG_OBS,
    SCHEMA_VERSION,
    Header,
    SessionKey,
)
from servo.policy import DecodedObservation
from servo.server.admission import ImageGate, TokenBucket
from servo.server.auth import SessionAuth
from servo.server.sessions import Decoded, Pending, Rejected, Session, SessionRegistry
from servo.wire import reply_header
from tests.server.policies import RelativeProcessor


class FakePublisher:
    """Records calls; ``put`` can be held open to race it against ``undeclare``."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.attachments: list[bytes] = []
        self.in_put = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def put(self, body: bytes, attachment: Any = None) -> None:
        self.calls.append("put")
        self.attachments.append(attachment)
        self.in_put.set()
        assert self.release.wait(5)

    def undeclare(self) -> None:
        self.calls.append("undeclare")


KEY = SessionKey(bytes(range(32)))


def make_session(registry: SessionRegistry, client: str = "c", *, epoch: int = 0) -> Session:
    session = Session(
        auth=SessionAuth(KEY, secrets.token_bytes(16), epoch),
        client_id=client,
        task="",
        rtc=False,
        schema_version=SCHEMA_VERSION,
        processor=RelativeProcessor(),
        publisher=FakePublisher(),  # type: ignore[arg-type]
        images=ImageGate({}, max_bytes=1 << 20),
        observations=TokenBucket(1000.0, 100),
    )
    registry.add(session)
    return session


def raw(seq: int, episode: int = 0) -> Pending:
    return Pending(Header(SCHEMA_VERSION, MSG_OBS, 0, seq, episode, 0, 0, bytes(16)), b"", seq)


def decoded(item: Pending) -> Decoded:
    obs = DecodedObservation(np.zeros(6, np.float32), {})
    return Decoded(item.header, obs, 0, item.received_ns, 0)


def test_idle_worker_decodes_itself_then_serves() -> None:
    registry = SessionRegistry()
    session = make_session(registry)
    assert registry.deposit(session, raw(1)) == "ok"
    assert registry.wait_work(timeout=1) == []  # woken by the raw observation: decode it yourself
    taken = registry.take_raw()
    assert taken is not None
    assert taken[1].header.seq_id == 1
    registry.finish_decode(session, taken[1], decoded(taken[1]))
    assert registry.wait_work(timeout=1) == [session]
    work = registry.take(session)
    assert work is not None
    assert (work.item.header.seq_id, work.superseded) == (1, 0)  # type: ignore[union-attr]


def test_newer_observation_supersedes_one_being_decoded() -> None:
    registry = SessionRegistry()
    session = make_session(registry)
    registry.deposit(session, raw(1))
    taken = registry.take_raw()
    assert taken is not None
    registry.deposit(session, raw(2))  # arrives while seq 1 is being decoded
    registry.finish_decode(session, taken[1], decoded(taken[1]))
    assert session.pending is None  # seq 1 discarded
    taken = registry.take_raw()
    assert taken is not None
    assert taken[1].header.seq_id == 2
    registry.finish_decode(session, taken[1], decoded(taken[1]))
    work = registry.take(session)
    assert work is not None
    assert (work.item.header.seq_id, work.superseded) == (2, 1)  # type: ignore[union-attr]


def test_a_decoding_rejection_is_served_as_an_error() -> None:
    registry = SessionRegistry()
    session = make_session(registry)
    registry.deposit(session, raw(1))
    taken = registry.take_raw()
    assert taken is not None
    rejected = Rejected(taken[1].header, "bad_observation", "garbage", 0)
    registry.finish_decode(session, taken[1], rejected)
    work = registry.take(session)
    assert work is not None
    assert work.item is rejected


def test_a_deposit_for_a_replaced_session_is_dropped() -> None:
    """Authentication and deposit are two steps: a session replaced in between gets nothing."""
    registry = SessionRegistry()
    old = make_session(registry)
    new = make_session(registry)  # same client: replaces ``old``
    assert registry.deposit(old, raw(1)) == "session"
    assert old.raw is None
    assert registry.deposit(new, raw(1)) == "ok"


def test_reset_discards_old_episode_in_every_stage() -> None:
    registry = SessionRegistry()
    session = make_session(registry)
    registry.deposit(session, raw(1, episode=0))
    taken = registry.take_raw()
    assert taken is not None
    registry.reset(session.session_id, 1)
    registry.finish_decode(session, taken[1], decoded(taken[1]))  # decoded after the reset
    assert session.pending is None
    assert registry.stale_drops == 1
    assert registry.deposit(session, raw(2, episode=0)) == "stale"
    assert registry.deposit(session, raw(3, episode=1)) == "ok"
    taken = registry.take_raw()
    assert taken is not None
    registry.finish_decode(session, taken[1], decoded(taken[1]))
    work = registry.take(session)
    assert work is not None
    assert work.reset  # the worker resets the processor before serving the new episode
    assert work.item.header.seq_id == 3  # type: ignore[union-attr]


def test_busy_worker_leaves_decoding_to_the_decoder_thread() -> None:
    registry = SessionRegistry()
    a, b = make_session(registry, "a"), make_session(registry, "b")
    registry.deposit(a, raw(1))
    taken = registry.take_raw()
    assert taken is not None
    registry.finish_decode(a, taken[1], decoded(taken[1]))
    assert registry.wait_work(timeout=1) == [a]  # the worker is busy from here on
    registry.deposit(b, raw(1))
    got = registry.wait_raw(timeout=1)
    assert got is not None
    assert got[0] is b


def test_flooding_client_does_not_grow_the_decode_queue() -> None:
    registry = SessionRegistry()
    session = make_session(registry)
    for seq in range(1, 1001):
        registry.deposit(session, raw(seq))
    assert len(registry._raw_queue) == 1
    assert session.superseded == 999
    taken = registry.take_raw()
    assert taken is not None
    assert taken[1].header.seq_id == 1000
    assert registry.take_raw() is None


def test_closed_publisher_waits_for_a_put_in_progress() -> None:
    """The event loop undeclaring while the worker publishes must not race (pyo3 would raise
    ``RuntimeError: Already borrowed`` and take the server down)."""
    registry = SessionRegistry()
    session = make_session(registry)
    publisher: FakePublisher = session.publisher  # type: ignore[assignment]
    publisher.release.clear()
    putter = threading.Thread(target=session.publish, args=(MSG_CHUNK, b"x"))
    putter.start()
    assert publisher.in_put.wait(5)
    closer = threading.Thread(target=session.close_publisher)
    closer.start()
    closer.join(0.05)
    assert closer.is_alive()  # blocked behind the put
    publisher.release.set()
    putter.join(5)
    closer.join(5)
    assert publisher.calls == ["put", "undeclare"]
    assert session.publish(MSG_CHUNK, b"y") is False
    session.close_publisher()  # idempotent
    assert publisher.calls == ["put", "undeclare"]


def test_messages_echo_the_request_they_answer_or_address_the_current_episode() -> None:
    registry = SessionRegistry()
    session = make_session(registry, epoch=3)
    publisher: FakePublisher = session.publisher  # type: ignore[assignment]
    sid = session.auth.wire_id
    request = Header(SCHEMA_VERSION, MSG_OBS, FLAG_EPISODE_START, 17, 2, 3, 123_456_789, sid)
    assert session.publish(MSG_CHUNK, b"chunk", request)
    # Sealed with the session key: it opens (and only over the very body that was sent).
    assert KEY.open(publisher.attachments[-1], b"chunk") == Header(
        SCHEMA_VERSION, MSG_CHUNK, 0, 17, 2, 3, 123_456_789, sid
    )
    registry.reset(session.session_id, 5)
    assert session.publish(MSG_DRAIN, b"notice")  # answers no request: the session's episode, no stamp
    assert KEY.open(publisher.attachments[-1], b"notice") == Header(SCHEMA_VERSION, MSG_DRAIN, 0, 0, 5, 3, 0, sid)
    # Without a session (an observation for an unknown one), the request's own header is echoed.
    echoed = Header(SCHEMA_VERSION, MSG_ERROR, 0, 17, 2, 3, 123_456_789, sid)
    assert reply_header(request, MSG_ERROR) == echoed
