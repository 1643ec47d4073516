"""The roster file: changed only under its lock, never loses a writer's change, forgets old tokens."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from servo._core import ServerIdentity
from servo.join import JoinToken
from servo.server.joins import issue, revoke_robot, revoke_token, spend
from servo.server.roster import RETAIN_S, Roster, RosterError, RosterFile

SERVER = ServerIdentity.generate().public_key
ROBOT = ServerIdentity.generate().public_key


def test_concurrent_writers_never_lose_each_others_changes(tmp_path: Path) -> None:
    """The CLI and a running server (or two replicas) edit one file: every change lands."""
    roster = Roster(tmp_path / "servo" / "default.roster")
    made: list[str] = []

    def write() -> None:
        for _ in range(5):
            token = roster.change(lambda f: issue(f, JoinToken.issue(SERVER), ttl_s=60, uses=1, now=time.time()))
            made.append(token.id)

    threads = [threading.Thread(target=write) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(t.id for t in roster.read().tokens) == sorted(made)
    assert len(made) == 30
    assert oct(roster.path.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in roster.path.parent.iterdir() if p.name.startswith(".")] == []  # no temporaries left


def test_a_token_is_spent_once_and_says_why_it_cannot_be_used(tmp_path: Path) -> None:
    now = 1_000_000.0
    file, token = issue(RosterFile(), JoinToken.issue(SERVER), ttl_s=600, uses=1, now=now)
    file, problem = spend(file, token.id, "robot-7", ROBOT, now + 1)
    assert problem is None
    assert [r.name for r in file.robots] == ["robot-7"]
    again, problem = spend(file, token.id, "robot-8", SERVER, now + 2)
    assert again == file
    assert problem == f"join token {token.id} was used already (by 'robot-7')"
    file, later = issue(file, JoinToken.issue(SERVER), ttl_s=60, uses=3, now=now)
    assert spend(file, later.id, "robot-9", SERVER, now + 3600)[1] == f"join token {later.id} expired 59 min ago"
    file, _ = revoke_token(file, later.id)
    assert spend(file, later.id, "robot-9", SERVER, now)[1] == f"join token {later.id} was revoked"
    assert spend(file, "nosuchid", "robot-9", SERVER, now)[1] == "join token nosuchid is not known to this server"
    file, gone = revoke_robot(file, "robot-7")
    assert gone
    assert file.robots == []


def test_long_expired_tokens_are_forgotten_and_the_secret_is_never_kept(tmp_path: Path) -> None:
    roster = Roster(tmp_path / "default.roster")
    old = roster.change(lambda f: issue(f, JoinToken.issue(SERVER), ttl_s=1, uses=1, now=time.time() - RETAIN_S - 10))
    fresh = roster.change(lambda f: issue(f, JoinToken.issue(SERVER), ttl_s=60, uses=1, now=time.time()))
    assert [t.id for t in roster.read().tokens] == [fresh.id]
    text = roster.path.read_text()
    assert str(fresh).split(".")[2] not in text  # the secret
    assert old.id not in text


@pytest.mark.parametrize("content", [b"{", b'{"robots": 3}', b'{"unknown": 1}'])
def test_a_malformed_roster_is_refused_in_one_line(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "default.roster"
    path.write_bytes(content)
    os.chmod(path, 0o600)
    with pytest.raises(RosterError, match=r"default\.roster: not a servo roster .*servo-serve robots manages it"):
        Roster(path).read()


def test_a_roster_others_may_write_is_refused(tmp_path: Path) -> None:
    roster = Roster(tmp_path / "default.roster")
    roster.change(lambda f: issue(f, JoinToken.issue(SERVER), ttl_s=60, uses=1, now=time.time()))
    roster.path.chmod(0o666)
    with pytest.raises(RosterError, match="roster is writable by others"):
        roster.read()
