"""Fixtures for the robot driver tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.robots.feetech_emulator import FeetechEmulator


@pytest.fixture
def emulator() -> Iterator[FeetechEmulator]:
    emu = FeetechEmulator().start()
    yield emu
    emu.close()
