"""Reading control-plane replies: `rejection_of` and `sealed_answer` (only what the check accepts)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from servo._core import AuthError
from servo.client import RequestTimeout, ServerError
from servo.client.replies import sealed_answer
from servo.wire import ControlAck, Rejection, decode, encode


@dataclass
class Payload:
    data: bytes

    def to_bytes(self) -> bytes:
        return self.data


@dataclass
class Part:
    payload: Payload
    attachment: Payload | None = None


@dataclass
class Reply:
    """Shaped like zenoh.Reply: exactly one of ``ok`` / ``err``."""

    ok: Part | None = None
    err: Part | None = None


def ok(body: bytes, attachment: bytes | None = None) -> Reply:
    return Reply(ok=Part(Payload(body), None if attachment is None else Payload(attachment)))


def err(body: bytes) -> Reply:
    return Reply(err=Part(Payload(body)))


REFUSED = encode(Rejection("unknown_session", "no session 7 for client 'a'"))
ACK = encode(ControlAck(bytes(16), 2))


def sealed_by_us(attachment: bytes | None, payload: bytes) -> ControlAck:
    if attachment != b"sealed":
        raise AuthError("tag mismatch")
    return decode(payload, ControlAck)


def test_only_an_answer_the_check_accepts_counts() -> None:
    refused: list[str] = []
    replies = [ok(ACK), ok(ACK, b"forged"), err(REFUSED), ok(ACK, b"sealed")]
    answer = sealed_answer(replies, sealed_by_us, refused=refused.append, unanswered="reset not answered")  # type: ignore[arg-type]
    assert answer == ControlAck(bytes(16), 2)
    assert refused == ["tag mismatch", "tag mismatch"]


def test_without_an_accepted_answer_a_refusal_is_raised_and_zenohs_own_errors_skipped() -> None:
    # A replica that did not finish in time yields Zenoh's b"Timeout" error reply; it is not a Rejection.
    replies = [err(b"Timeout"), err(REFUSED), ok(ACK, b"forged")]
    with pytest.raises(ServerError) as server_error:
        sealed_answer(replies, sealed_by_us, refused=lambda _: None, unanswered="reset not answered")  # type: ignore[arg-type]
    assert (server_error.value.code, server_error.value.message) == ("unknown_session", "no session 7 for client 'a'")


def test_no_accepted_answer_is_a_timeout_named_by_the_caller() -> None:
    for replies in ([], [err(b"Timeout")], [ok(ACK, b"forged")]):
        with pytest.raises(RequestTimeout, match=r"^reset not answered within 1 s$"):
            sealed_answer(replies, sealed_by_us, refused=lambda _: None, unanswered="reset not answered within 1 s")  # type: ignore[arg-type]
