"""Join tokens: the text form, and a proof that holds for one open only."""

from __future__ import annotations

import msgspec
import pytest

from servo._core import ServerIdentity
from servo.join import JoinToken, JoinTokenError, sign_join, verify_join
from servo.wire import Features, SessionOpen

PREFIX = "@servo/default/model/r1"


def an_open(**changes: object) -> SessionOpen:
    request = SessionOpen("robot-7", [2], Features(["a"], ["a"], {}), 30.0, bytes(range(32)), nonce=b"n" * 16)
    request = msgspec.structs.replace(request, robot_key=bytes(32), robot_signature=bytes(64), join_id="abcdefgh")
    return msgspec.structs.replace(request, **changes)


@pytest.mark.parametrize("pin", [b"", bytes(range(32))])
def test_a_token_reads_back_as_written(pin: bytes) -> None:
    token = JoinToken.issue(ServerIdentity.generate().public_key, pin)
    text = str(token)
    assert text.startswith("servo-join-v1.")
    assert text.count(".") == (4 if pin else 3)
    assert JoinToken.parse(text) == token
    assert JoinToken.parse(f"  {text}\n") == token


def test_the_secret_never_shows_in_a_repr_or_an_error() -> None:
    token = JoinToken.issue(ServerIdentity.generate().public_key)
    secret = str(token).split(".")[2]
    assert secret not in repr(token)
    broken = str(token).replace(str(token).split(".")[3], "x" * 43)
    with pytest.raises(JoinTokenError) as error:
        JoinToken.parse(broken)
    assert secret not in str(error.value)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("hello", "not a servo join token"),
        ("servo-join-v2.abcdefgh.AAAAAAAAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "not a servo"),
        ("servo-join-v1.ABCDEFGH.AAAAAAAAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "id is not"),
        ("servo-join-v1.abcdefgh.AAAA.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "secret does not encode 16"),
        ("servo-join-v1.abcdefgh.AAAAAAAAAAAAAAAAAAAAAA.AA", "server identity does not encode 32"),
        (
            "servo-join-v1.abcdefgh.AAAAAAAAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA.!",
            "certificate pin",
        ),
    ],
)
def test_malformed_tokens_are_refused_in_one_line(text: str, why: str) -> None:
    with pytest.raises(JoinTokenError, match=why) as error:
        JoinToken.parse(text)
    assert "\n" not in str(error.value)


def test_the_proof_verifies_for_its_open_only() -> None:
    token = JoinToken.issue(ServerIdentity.generate().public_key)
    request = sign_join(an_open(join_id=token.id), token, PREFIX)
    assert verify_join(request, PREFIX, token.verifier)
    assert not verify_join(request, PREFIX, JoinToken.issue(token.server).verifier)  # another token
    assert not verify_join(request, "@servo/default/model/r2", token.verifier)  # another replica
    for change in (
        {"client_id": "robot-8"},
        {"robot_key": bytes([1]) * 32},
        {"nonce": b"m" * 16},
        {"client_key": bytes([2]) * 32},
        {"join_id": "bbbbbbbb"},
    ):
        assert not verify_join(msgspec.structs.replace(request, **change), PREFIX, token.verifier), change
