"""The session registry on its own: newest-wins mailboxes, take and claim."""

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
from servo.server.sessions import Claim, Decoded, Session, SessionRegistry
from servo.wire import reply_header
from tests.server.policies import RelativeProcessor


class FakePublisher:
    """Records calls; ``put`` can be held open to race it against ``undeclare``."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.attachments: list[bytes] = []
        self.bodies: list[bytes] = []
        self.in_put = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def put(self, body: bytes, attachment: Any = None) -> None:
        self.calls.append("put")
        self.attachments.append(attachment)
        self.bodies.append(body)
        self.in_put.set()
        assert self.release.wait(5)

    def undeclare(self) -> None:
        self.calls.append("undeclare")


SECRET = bytes(range(32))
#: The client's end of every session made here (it decrypts what the sessions publish).
CLIENT = SessionKey(SECRET, role="client")


def make_session(registry: SessionRegistry, client: str = "c", *, epoch: int = 0) -> Session:
    session = Session(
        auth=SessionAuth(SessionKey(SECRET, role="server"), secrets.token_bytes(16), epoch),
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


def obs(seq: int, episode: int = 0) -> Decoded:
    header = Header(SCHEMA_VERSION, MSG_OBS, 0, seq, episode, 0, 0, bytes(16))
    return Decoded(header, DecodedObservation(np.zeros(6, np.float32), {}), 0, seq, 0, seq)


def test_take_then_claim_serves_the_newest_observation() -> None:
    registry = SessionRegistry()
    session = make_session(registry)
    assert registry.deposit(session, obs(1)) == "ok"
    assert registry.deposit(session, obs(2)) == "ok"  # newest wins
    assert registry.wait_ready(timeout=1)
    ((taken_session, item),) = registry.take()
    assert (taken_session, item.header.seq_id) == (session, 2)
    assert registry.take() == []  # held: nothing more to take
    assert not registry.has_ready()
    assert registry.claim(session, item) == Claim(item, superseded=1, reset=False)
    assert session.superseded == 0


def test_a_deposit_while_held_takes_the_held_observations_turn() -> None:
    registry = SessionRegistry()
    session = make_session(registry)
    registry.deposit(session, obs(1))
    ((_, held),) = registry.take()
    newer = obs(2)
    registry.deposit(session, newer)  # arrives while seq 1 waits for the device
    assert not registry.has_ready()  # not queued a second time: it waits for seq 1's claim
    assert registry.claim(session, held) == Claim(newer, superseded=1, reset=False)  # served now
    assert registry.take() == []
    assert session.mailbox is None


def test_a_newer_observation_of_a_reset_episode_is_not_served_in_the_held_ones_turn() -> None:
    registry = SessionRegistry()
    session = make_session(registry)
    registry.deposit(session, obs(1, episode=0))
    ((_, held),) = registry.take()
    registry.deposit(session, obs(2, episode=0))
    registry.reset(session.session_id, 1)  # drops the waiting seq 2
    assert registry.claim(session, held) is None  # seq 1 is of the old episode too
    assert registry.stale_drops == 1


def test_a_deposit_for_a_replaced_session_is_dropped() -> None:
    """Authentication and deposit are two steps: a session replaced in between gets nothing."""
    registry = SessionRegistry()
    old = make_session(registry)
    new = make_session(registry)  # same client: replaces ``old``
    assert registry.deposit(old, obs(1)) == "session"
    assert old.mailbox is None
    assert registry.deposit(new, obs(1)) == "ok"


def test_a_held_observation_of_a_closed_session_is_not_served() -> None:
    registry = SessionRegistry()
    session = make_session(registry)
    registry.deposit(session, obs(1))
    ((_, held),) = registry.take()
    registry.remove(session.session_id)
    assert registry.claim(session, held) is None


def test_reset_discards_old_episode_in_every_stage() -> None:
    registry = SessionRegistry()
    session = make_session(registry)
    registry.deposit(session, obs(1, episode=0))
    ((_, held),) = registry.take()
    registry.reset(session.session_id, 1)
    assert registry.claim(session, held) is None  # taken before the reset, claimed after it
    assert registry.stale_drops == 1
    assert registry.deposit(session, obs(2, episode=0)) == "stale"
    registry.deposit(session, obs(3, episode=1))
    registry.deposit(session, obs(4, episode=1))
    registry.reset(session.session_id, 2)  # a waiting observation of an older episode is dropped
    assert registry.take() == []
    assert registry.deposit(session, obs(5, episode=2)) == "ok"
    ((_, item),) = registry.take()
    claim = registry.claim(session, item)
    assert claim is not None
    assert claim.reset  # the worker resets the processor before serving the new episode
    assert registry.stale_drops == 2


def test_take_is_in_ring_order_after_the_session_served_last() -> None:
    registry = SessionRegistry()
    a, b, c = (make_session(registry, name) for name in "abc")
    registry.deposit(a, obs(1))
    ((_, item),) = registry.take()
    assert registry.claim(a, item) is not None  # a was served last
    for session in (c, a, b):
        registry.deposit(session, obs(2))
    assert [s.client_id for s, _ in registry.take()] == ["b", "c", "a"]


def test_flooding_client_holds_one_mailbox_slot() -> None:
    registry = SessionRegistry()
    session = make_session(registry)
    for seq in range(1, 1001):
        registry.deposit(session, obs(seq))
    assert session.superseded == 999
    ((_, item),) = registry.take()
    assert item.header.seq_id == 1000
    assert registry.take() == []


def test_close_wakes_a_waiting_worker() -> None:
    registry = SessionRegistry()
    woke = threading.Event()

    def wait() -> None:
        registry.wait_ready(timeout=10)
        woke.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    registry.close()
    assert woke.wait(5)
    waiter.join(5)
    assert not registry.wait_ready(timeout=0)


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
    # Encrypted with the session key: only the client's end reads it.
    assert publisher.bodies[-1] != b"chunk"
    assert CLIENT.decrypt(publisher.attachments[-1], publisher.bodies[-1]) == (
        Header(SCHEMA_VERSION, MSG_CHUNK, 0, 17, 2, 3, 123_456_789, sid),
        b"chunk",
    )
    registry.reset(session.session_id, 5)
    assert session.publish(MSG_DRAIN, b"notice")  # answers no request: the session's episode, no stamp
    assert CLIENT.decrypt(publisher.attachments[-1], publisher.bodies[-1]) == (
        Header(SCHEMA_VERSION, MSG_DRAIN, 0, 0, 5, 3, 0, sid),
        b"notice",
    )
    # A second answer of a type to the same request would repeat a nonce: not sent.
    assert session.publish(MSG_CHUNK, b"again", request) is False
    assert len(publisher.bodies) == 2
    # Without a session (an observation for an unknown one), the request's own header is echoed.
    echoed = Header(SCHEMA_VERSION, MSG_ERROR, 0, 17, 2, 3, 123_456_789, sid)
    assert reply_header(request, MSG_ERROR) == echoed
