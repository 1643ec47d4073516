"""The known-servers file: written private, refused when others may write it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from servo._core import ServerIdentity
from servo.client.errors import UntrustedServer
from servo.client.known import KnownServers


def test_known_servers_are_written_private_whatever_the_umask(tmp_path: Path) -> None:
    known = KnownServers(tmp_path / "known_servers")
    identity = ServerIdentity.generate().public_key
    previous = os.umask(0o002)
    try:
        known.replace("*/*", [identity])
    finally:
        os.umask(previous)
    assert stat.S_IMODE(known.path.stat().st_mode) == 0o600
    assert known.identities("*/*") == {identity}


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_known_servers_others_may_write_are_refused_in_one_line(tmp_path: Path, mode: int) -> None:
    known = KnownServers(tmp_path / "known_servers")
    known.replace("*/*", [ServerIdentity.generate().public_key])
    known.path.chmod(mode)
    with pytest.raises(UntrustedServer, match=f"writable by others \\(mode {mode:04o}\\); chmod 600 it"):
        known.entries()
