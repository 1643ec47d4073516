"""Fixtures of the deployment tests: a local Ray head per module, a Python-opened Zenoh router."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zenoh

from servo.transport import ZenohSettings
from tests.deploy.helpers import RayHead, local_ray_head
from tests.support import free_port


@pytest.fixture(scope="module")
def ray_head() -> Iterator[RayHead]:
    """One local head for the tests of a module."""
    with local_ray_head() as head:
        yield head


@pytest.fixture
def router() -> Iterator[int]:
    """A plain Zenoh router opened from Python on a free loopback port; yields the port."""
    port = free_port()
    session = zenoh.open(ZenohSettings(mode="router", listen=[f"tcp/127.0.0.1:{port}"]).to_config())
    try:
        yield port
    finally:
        session.close()
