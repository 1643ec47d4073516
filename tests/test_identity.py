"""The replica's identity file: created 0600 and kept, refused when others can read it."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from servo.server.identity import IdentityError, load_identity
from servo.wire import fingerprint


def test_a_missing_identity_is_created_private_then_reused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="servo")
    path = tmp_path / "server.key"
    first = load_identity(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().startswith("servo-identity-v1 ")
    created = [r.msg for r in caplog.records if "identity created" in str(r.msg)]
    assert len(created) == 1
    assert fingerprint(first.public_key) in str(created[0])  # the fingerprint, never the seed
    assert first.seed.hex() not in caplog.text
    again = load_identity(path)
    assert again.public_key == first.public_key  # replicas sharing the file share the identity


def test_an_empty_setting_gives_an_ephemeral_identity() -> None:
    assert load_identity("").public_key != load_identity("").public_key


def test_an_identity_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "server.key"
    load_identity(path)
    os.chmod(path, 0o644)
    with pytest.raises(
        IdentityError, match=r"server.key: identity key is accessible by others \(mode 0644\); chmod 600"
    ):
        load_identity(path)


@pytest.mark.parametrize("text", ["", "hello", "servo-identity-v1 abc", "-----BEGIN PRIVATE KEY-----\nMC4CAQAw\n"])
def test_a_file_that_is_no_identity_is_refused_in_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "server.key"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(IdentityError, match=r"server\.key: not a servo identity key"):
        load_identity(path)


def test_an_unwritable_place_is_named(tmp_path: Path) -> None:
    with pytest.raises(IdentityError, match="cannot create the identity key"):
        load_identity(tmp_path / "no" / "such" / "dir" / "server.key")
