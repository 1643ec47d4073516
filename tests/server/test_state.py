"""ServerState: the lifecycle the control plane, the worker and the health endpoint all read."""

from __future__ import annotations

import anyio
import pytest

from servo.policy.compatibility import describe
from servo.server.state import Replica, ServerState
from servo.wire import ServerKeys
from tests.server.policies import FixedComputePolicy

pytestmark = pytest.mark.anyio


def replica(max_sessions: int = 4) -> Replica:
    info = describe(FixedComputePolicy().spec, serving_mode="shared")
    return Replica("host-1", ServerKeys("app", "model", "r1"), info, max_sessions)


async def test_lifecycle_starting_serving_draining() -> None:
    state = ServerState(client_grace_s=1.0)
    assert state.health() == (False, "starting")
    with pytest.raises(RuntimeError, match="not bound"):
        _ = state.replica
    async with anyio.create_task_group() as tg:
        state.bind(replica(4), tg)
        assert state.metrics.registry.get_sample_value("servo_max_sessions") == 4
        assert state.load == 0.0
        assert state.health() == (False, "starting")
        state.start_serving()
        assert state.health() == (True, "serving")
        assert state.drain() is True
        assert state.drain() is False  # already draining
        assert state.health() == (False, "draining")


async def test_a_drain_before_serving_is_final() -> None:
    state = ServerState(client_grace_s=1.0)
    async with anyio.create_task_group() as tg:
        state.bind(replica(), tg)
        state.drain()
        state.start_serving()
        assert state.lifecycle == "draining"
