"""Discovery tells the truth about why nothing was found."""

from __future__ import annotations

import pytest

from servo.client import NoServerFound, PolicyClient
from servo.transport import ZenohSettings
from tests.support import free_port

pytestmark = pytest.mark.anyio


async def test_an_empty_network_is_reported_as_such_not_as_a_timeout() -> None:
    # A lone peer: zenoh ends the status query at once since no queryable matches.
    settings = ZenohSettings(mode="peer", listen=[f"tcp/127.0.0.1:{free_port()}"])
    async with PolicyClient.connect(settings, "lonely") as client:
        with pytest.raises(NoServerFound) as info:
            await client.discover(timeout=5.0)
    assert str(info.value) == "no servo server answered on @servo/*/*/*/status (none is reachable)"
