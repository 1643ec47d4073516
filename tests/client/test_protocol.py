"""`SessionProtocol` with plain bytes: which server message may touch the request in flight.

No Zenoh, no threads: each rule of `servo.client.protocol` is one message in and one verdict out,
as the server's `servo.server.auth` is tested.
"""

from __future__ import annotations

import numpy as np
import pytest

from servo._core import (
    ATTACHMENT_SIZE,
    FLAG_COPY,
    FLAG_EPISODE_START,
    MSG_CHUNK,
    MSG_CONTROL,
    MSG_CONTROL_ACK,
    MSG_DRAIN,
    MSG_ERROR,
    MSG_OBS,
    AuthError,
    Header,
    KeyPair,
    ServerIdentity,
    SessionKey,
    unauthenticated,
)
from servo.client import ServerError, SessionLost
from servo.client.protocol import MAX_NOTICE_CHECKS, Answered, Dropped, Lost, SessionProtocol
from servo.client.results import ChunkResult
from servo.client.verify import ClientCounters
from servo.wire import ControlAck, DrainNotice, ErrorEvent, encode, notice_transcript, reply_header, resume_body
from tests.client.test_verify import chunk
from tests.client.test_verify import signed_ack as make_ack

SECRET = bytes(range(32))
GOOD = np.ones((5, 6), np.float32)


SERVER = ServerIdentity.generate()
ACTION = "@servo/lab/act/r1/c/robot-7/action"


def established(epoch: int = 3) -> SessionProtocol:
    protocol = SessionProtocol(
        epoch=epoch,
        action_dim=6,
        counters=ClientCounters(),
        max_chunk_steps=50,
        action_key=ACTION,
        server_identity=SERVER.public_key,
    )
    protocol.established(make_ack(SERVER, KeyPair().public_key), SessionKey(SECRET, role="client"))
    return protocol


def notice(attachment: bytes, *, by: ServerIdentity = SERVER, action_key: str = ACTION) -> bytes:
    """An unknown_session notice body, signed like a replica signs it."""
    code, message = "unknown_session", "no session here"
    return encode(ErrorEvent(code, message, by.sign(notice_transcript(action_key, attachment, code, message))))


def answer(
    request: Header, msg_type: int, body: bytes, *, secret: bytes = SECRET, **changes: int
) -> tuple[bytes, bytes]:
    """``(attachment, ciphertext)`` of a server's answer to ``request`` (its own end of the session)."""
    return SessionKey(secret, role="server").encrypt(reply_header(request, msg_type).replace(**changes), body)


def test_nothing_is_sent_before_the_handshake() -> None:
    protocol = SessionProtocol(epoch=0, action_dim=6, counters=ClientCounters())
    with pytest.raises(SessionLost):
        protocol.observation(mono_ns=1, episode_start=False)
    assert protocol.resume_proof(bytes(32)) == b""


def test_the_answer_to_the_request_in_flight_is_accepted_once() -> None:
    protocol = established()
    request = protocol.observation(mono_ns=1_000, episode_start=True)
    assert (request.msg_type, request.seq_id, request.session_epoch) == (MSG_OBS, 1, 3)
    assert request.session_id == protocol.wire_id
    assert protocol.in_flight == 1
    body = encode(chunk(GOOD))
    replay = answer(request, MSG_CHUNK, body)
    verdict = protocol.on_action(*replay, 5_000)
    assert isinstance(verdict, Answered)
    assert isinstance(verdict.result, ChunkResult)
    assert (verdict.result.seq_id, verdict.result.rtt_ns, verdict.result.obs_mono_ns) == (1, 4_000, 1_000)
    np.testing.assert_array_equal(verdict.result.chunk_robot, GOOD)
    assert protocol.in_flight is None
    # The same chunk again (a replay, or a duplicate): the request is answered already.
    assert isinstance(protocol.on_action(*replay, 6_000), Dropped)
    assert protocol.counters.chunks_rejected["stale_seq"] == 1


def test_a_newer_request_supersedes_the_one_in_flight() -> None:
    protocol = established()
    old = protocol.observation(mono_ns=1, episode_start=False)
    new = protocol.observation(mono_ns=2, episode_start=False)
    body = encode(chunk(GOOD))
    assert isinstance(protocol.on_action(*answer(old, MSG_CHUNK, body), 3), Dropped)
    assert isinstance(protocol.on_action(*answer(new, MSG_CHUNK, body), 3), Answered)
    assert protocol.stats.dropped_stale == 1


@pytest.mark.parametrize("answered", ["original", "copy"])
def test_a_request_sent_again_takes_the_first_answer_to_either_seq(answered: str) -> None:
    protocol = established()
    original = protocol.observation(mono_ns=1_000, episode_start=True)
    copy = protocol.observation(mono_ns=1_000, episode_start=True, resend=True)
    assert (copy.seq_id, protocol.in_flight, protocol.resent_seq) == (2, 2, 1)
    # The copy says so, and carries the original's observation stamp and flags.
    assert (original.flags, copy.flags) == (FLAG_EPISODE_START, FLAG_EPISODE_START | FLAG_COPY)
    assert copy.client_mono_ns == original.client_mono_ns
    assert (protocol.stats.resent, protocol.counters.resent) == (1, 1)
    first, second = (original, copy) if answered == "original" else (copy, original)
    body = encode(chunk(GOOD))
    verdict = protocol.on_action(*answer(first, MSG_CHUNK, body), 5_000)
    assert isinstance(verdict, Answered)
    assert isinstance(verdict.result, ChunkResult)
    assert (verdict.result.seq_id, verdict.result.rtt_ns) == (first.seq_id, 4_000)
    # The other answer is for the same observation, but the request is answered: it is dropped
    # as expected, neither stale nor refused, even once a newer request is in flight.
    protocol.observation(mono_ns=2_000, episode_start=False)
    assert isinstance(protocol.on_action(*answer(second, MSG_CHUNK, body), 6_000), Dropped)
    assert (protocol.stats.copy_answers, protocol.stats.dropped_stale) == (1, 0)
    assert not +protocol.counters.chunks_rejected
    # Once only: the same answer again is a replay.
    assert isinstance(protocol.on_action(*answer(second, MSG_CHUNK, body), 7_000), Dropped)
    assert protocol.counters.chunks_rejected["stale_seq"] == 1


def test_only_the_request_in_flight_is_sent_again_and_a_newer_request_forgets_the_copy() -> None:
    protocol = established()
    with pytest.raises(ValueError, match="no request in flight"):
        protocol.observation(mono_ns=1, episode_start=False, resend=True)
    original = protocol.observation(mono_ns=1, episode_start=False)
    protocol.observation(mono_ns=1, episode_start=False, resend=True)
    newer = protocol.observation(mono_ns=2, episode_start=False)
    body = encode(chunk(GOOD))
    # Only the copy's own request could take the original's answer; a newer observation cannot.
    assert isinstance(protocol.on_action(*answer(original, MSG_CHUNK, body), 3), Dropped)
    assert isinstance(protocol.on_action(*answer(newer, MSG_CHUNK, body), 3), Answered)
    with pytest.raises(ValueError, match="no request in flight"):
        protocol.observation(mono_ns=3, episode_start=False, resend=True)


@pytest.mark.parametrize(
    ("forgery", "reason"),
    [
        ("another key", "mac"),
        ("no attachment", "mac"),
        ("ciphertext changed", "mac"),
        ("another session", "session"),
        ("another epoch", "epoch"),
    ],
)
def test_what_does_not_verify_never_touches_the_request(forgery: str, reason: str) -> None:
    protocol = established()
    request = protocol.observation(mono_ns=1, episode_start=False)
    body = encode(chunk(GOOD))
    attachment, ciphertext = answer(request, MSG_CHUNK, body)
    message: tuple[bytes | None, bytes] = {
        "another key": answer(request, MSG_CHUNK, body, secret=bytes(32)),
        "no attachment": (None, ciphertext),
        "ciphertext changed": (attachment, bytes([ciphertext[0] ^ 1]) + ciphertext[1:]),
        "another session": answer(request, MSG_CHUNK, body, session_id=bytes(16)),
        "another epoch": answer(request, MSG_CHUNK, body, session_epoch=4),
    }[forgery]
    assert isinstance(protocol.on_action(*message, 2), Dropped)
    assert protocol.counters.chunks_rejected[reason] == 1
    assert protocol.in_flight == 1


def test_an_authenticated_but_unusable_chunk_fails_the_request() -> None:
    protocol = established()
    request = protocol.observation(mono_ns=1, episode_start=False)
    nan = GOOD.copy()
    nan[0, 0] = np.nan
    body = encode(chunk(nan))
    verdict = protocol.on_action(*answer(request, MSG_CHUNK, body), 2)
    assert isinstance(verdict, Answered)
    assert isinstance(verdict.result, ServerError)
    assert verdict.result.code == "bad_chunk"
    assert protocol.counters.chunks_rejected["non_finite"] == 1


def test_an_encrypted_error_and_an_encrypted_drain() -> None:
    protocol = established()
    request = protocol.observation(mono_ns=1, episode_start=False)
    body = encode(ErrorEvent("bad_observation", "wrong size"))
    verdict = protocol.on_action(*answer(request, MSG_ERROR, body), 2)
    assert isinstance(verdict, Answered)
    assert isinstance(verdict.result, ServerError)
    assert verdict.result.code == "bad_observation"
    drain = encode(DrainNotice("bye"))
    assert protocol.on_action(*answer(request, MSG_DRAIN, drain), 3) == Lost("bye")
    forged = unauthenticated(reply_header(request, MSG_DRAIN))
    assert isinstance(protocol.on_action(forged, drain, 3), Dropped)


def test_a_keyless_notice_ends_the_request_only_when_the_replica_signed_it_for_that_request() -> None:
    protocol = established()
    request = protocol.observation(mono_ns=1, episode_start=False)
    keyless = unauthenticated(reply_header(request, MSG_ERROR))
    forgeries = {
        "unsigned": encode(ErrorEvent("unknown_session", "no session here")),
        "signed by another identity": notice(keyless, by=ServerIdentity.generate()),
        "signed for another replica": notice(keyless, action_key="@servo/lab/act/r2/c/robot-7/action"),
        "signed for another client": notice(keyless, action_key="@servo/lab/act/r1/c/oracle-1/action"),
        "signed for another request": notice(unauthenticated(reply_header(request, MSG_ERROR).replace(seq_id=7))),
    }
    for name, body in forgeries.items():
        assert isinstance(protocol.on_action(keyless, body, 2), Dropped), name
    other = unauthenticated(reply_header(request, MSG_ERROR).replace(seq_id=7))
    assert isinstance(protocol.on_action(other, notice(other), 2), Dropped)  # genuine, but not for us
    chunk_lookalike = unauthenticated(reply_header(request, MSG_CHUNK))
    assert isinstance(protocol.on_action(chunk_lookalike, encode(chunk(GOOD)), 2), Dropped)
    assert protocol.counters.unknown_session_hints == 0
    verdict = protocol.on_action(keyless, notice(keyless), 2)
    assert isinstance(verdict, Answered)
    assert isinstance(verdict.result, ServerError)
    assert verdict.result.code == "unknown_session"
    assert protocol.counters.unknown_session_hints == 1
    assert protocol.counters.chunks_rejected["mac"] == len(forgeries) + 2


def test_a_flood_of_forged_notices_costs_a_bounded_number_of_signature_checks() -> None:
    protocol = established()
    request = protocol.observation(mono_ns=1, episode_start=False)
    keyless = unauthenticated(reply_header(request, MSG_ERROR))
    forged = notice(keyless, by=ServerIdentity.generate())
    for _ in range(MAX_NOTICE_CHECKS):
        assert isinstance(protocol.on_action(keyless, forged, 2), Dropped)
    # Past the bound, even the genuine notice is dropped unverified: the request times out instead.
    assert isinstance(protocol.on_action(keyless, notice(keyless), 2), Dropped)
    # Sending the request again buys no new budget: the copy is the same request.
    copy = protocol.observation(mono_ns=1, episode_start=False, resend=True)
    keyless = unauthenticated(reply_header(copy, MSG_ERROR))
    assert isinstance(protocol.on_action(keyless, notice(keyless), 3), Dropped)
    # The next request has its own budget.
    request = protocol.observation(mono_ns=3, episode_start=False)
    keyless = unauthenticated(reply_header(request, MSG_ERROR))
    assert isinstance(protocol.on_action(keyless, notice(keyless), 4), Answered)


def test_oversized_messages_are_refused_before_they_are_copied() -> None:
    protocol = established()
    assert protocol.oversized(ATTACHMENT_SIZE, 100) is None
    assert protocol.oversized(None, 100) is None  # judged (and refused) by on_action
    refused = protocol.oversized(ATTACHMENT_SIZE + 1, 100)
    assert refused is not None
    assert refused.reason == "mac"
    refused = protocol.oversized(ATTACHMENT_SIZE, protocol.max_message_bytes + 1)
    assert refused is not None
    assert refused.reason == "undecodable"
    protocol.refuse(refused)
    assert protocol.counters.chunks_rejected["undecodable"] == 1


def test_control_requests_have_their_own_stream_and_encrypted_acks() -> None:
    protocol = established()
    protocol.observation(mono_ns=1, episode_start=False)
    first, second = protocol.control_header(), protocol.control_header()
    assert (first.msg_type, first.seq_id, second.seq_id) == (MSG_CONTROL, 1, 2)
    body = encode(ControlAck(protocol.wire_id, 4))
    ack = answer(second, MSG_CONTROL_ACK, body)
    assert protocol.open_control_ack(second, *ack) == ControlAck(protocol.wire_id, 4)
    with pytest.raises(AuthError, match="another request"):
        protocol.open_control_ack(first, *ack)
    with pytest.raises(AuthError):
        protocol.open_control_ack(second, *answer(second, MSG_CONTROL_ACK, body, secret=bytes(32)))
    with pytest.raises(AuthError, match="no attachment"):
        protocol.open_control_ack(second, None, ack[1])


def test_a_resume_proof_is_made_over_the_new_client_key() -> None:
    protocol = established()
    proof = protocol.resume_proof(b"k" * 32)
    server = SessionKey(SECRET, role="server")
    header = server.verify(proof, resume_body(b"k" * 32))
    assert (header.msg_type, header.session_id) == (MSG_CONTROL, protocol.wire_id)
    with pytest.raises(AuthError):
        server.verify(proof, resume_body(b"x" * 32))


def test_a_failed_send_fails_only_the_request_in_flight() -> None:
    protocol = established()
    protocol.observation(mono_ns=1, episode_start=False)
    protocol.observation(mono_ns=2, episode_start=False)
    assert not protocol.fail(1, RuntimeError("old"))
    assert protocol.fail(2, RuntimeError("put failed"))
    assert not protocol.fail(2, RuntimeError("twice"))
    assert isinstance(protocol.result, RuntimeError)
