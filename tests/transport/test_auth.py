"""User/password authentication settings: the password comes from its own file, never the manifest."""

from __future__ import annotations

from pathlib import Path

import pytest

from servo.config import ConfigError
from servo.server.manifest import parse_manifest


def _manifest(secret: Path) -> str:
    return f"""
[model]
source = "reference"
[zenoh]
mode = "client"
connect = ["tcp/127.0.0.1:7447"]
[zenoh.auth]
user = "gpu-0"
password_file = "{secret}"
"""


def test_the_password_is_read_from_its_file(tmp_path: Path) -> None:
    secret = tmp_path / "gpu-0.secret"
    secret.write_text("s3cret\n")
    config = parse_manifest(_manifest(secret)).zenoh.to_config()
    assert config.get_json("transport/auth/usrpwd/user") == '"gpu-0"'
    assert config.get_json("transport/auth/usrpwd/password") == '"s3cret"'


def test_a_missing_password_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"zenoh\.auth\.password_file = '.*nope': file does not exist"):
        parse_manifest(_manifest(tmp_path / "nope"))
