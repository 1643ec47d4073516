"""Fixtures shared by every test (the servo directory is redirected in the root conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import free_port


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"use_uvloop": True})


@pytest.fixture
def port() -> int:
    """A loopback TCP port that was free when the test started."""
    return free_port()
