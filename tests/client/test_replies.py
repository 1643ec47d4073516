"""read_reply: the one reading of control-plane replies (session open, reset, trajectory fetch)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from servo.client import RequestTimeout, ServerError, SessionRejected
from servo.client.replies import read_reply
from servo.wire import ControlAck, Rejection, encode


@dataclass
class Payload:
    data: bytes

    def to_bytes(self) -> bytes:
        return self.data


@dataclass
class Part:
    payload: Payload


@dataclass
class Reply:
    """Shaped like zenoh.Reply: exactly one of ``ok`` / ``err``."""

    ok: Part | None = None
    err: Part | None = None


def ok(body: bytes) -> Reply:
    return Reply(ok=Part(Payload(body)))


def err(body: bytes) -> Reply:
    return Reply(err=Part(Payload(body)))


REFUSED = encode(Rejection("unknown_session", "no session 7 for client 'a'"))


def test_the_answer_is_decoded_as_the_expected_struct() -> None:
    ack = read_reply([ok(encode(ControlAck(7, 2)))], ControlAck, unanswered="reset not answered")  # type: ignore[list-item]
    assert ack == ControlAck(7, 2)


def test_zenohs_own_errors_are_skipped_and_a_rejection_is_raised_as_asked() -> None:
    # A replica that did not finish in time yields Zenoh's b"Timeout" error reply; it is not a Rejection.
    replies = [err(b"Timeout"), err(REFUSED)]
    with pytest.raises(ServerError) as server_error:
        read_reply(replies, ControlAck, unanswered="reset not answered")  # type: ignore[arg-type]
    assert (server_error.value.code, server_error.value.message) == ("unknown_session", "no session 7 for client 'a'")
    with pytest.raises(SessionRejected) as rejected:
        read_reply(replies, ControlAck, unanswered="open not answered", rejected=SessionRejected)  # type: ignore[arg-type]
    assert rejected.value.rejection.code == "unknown_session"


def test_no_answer_is_a_timeout_named_by_the_caller() -> None:
    for replies in ([], [err(b"Timeout")]):
        with pytest.raises(RequestTimeout, match=r"^reset not answered within 1 s$"):
            read_reply(replies, ControlAck, unanswered="reset not answered within 1 s")  # type: ignore[arg-type]
