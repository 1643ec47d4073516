"""Fixtures shared by every test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servo.home import CONFIG_DIR_VARIABLE
from tests.support import free_port


@pytest.fixture(autouse=True)
def servo_config_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, not yet created servo directory for every test (identities, known servers).

    Set in the environment, so processes a test starts use it too; nothing reaches the user's
    own ``~/.config/servo``.
    """
    path = tmp_path_factory.mktemp("servo-home") / "servo"
    monkeypatch.setenv(CONFIG_DIR_VARIABLE, str(path))
    return path


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"use_uvloop": True})


@pytest.fixture
def port() -> int:
    """A loopback TCP port that was free when the test started."""
    return free_port()
