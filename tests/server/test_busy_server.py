"""A busy server keeps its robots: nothing on Zenoh's receive path of the server waits for the GIL.

Zenoh closes a link when its receive task read nothing from it for the peer's lease, and that
task runs the callbacks of the samples it reads. A callback run there must take the GIL first: in
a server whose Python holds the GIL longer than the robot's lease (a policy that holds it through
a forward, a starved thread holding it at load 20 on 2 cores), the link expired with the robot
still streaming, both ends saw the other's liveliness token vanish and the robot reconnected
("server liveliness lost"; `servo.server.lanes`).

Here the server's process holds the GIL for three of the robot's leases while the robot's bytes
arrive (on the observation key and as a status query, the two paths every robot uses); the
session must survive, the server must then handle what came, and the next request is answered.
"""

from __future__ import annotations

import numpy as np
import pytest

from servo.client import PolicyClient
from servo.transport import ZenohSettings
from tests.server.helpers import metric
from tests.support import eventually, hold_gil, keep_sending, make_manifest, running_server

pytestmark = pytest.mark.anyio

#: The robot's lease: how long the server's receive task may read nothing from its link.
LEASE_MS = 500
HOLD_S = 3 * LEASE_MS / 1000
FRAMES = {"front": np.zeros((48, 64, 3), np.uint8)}
#: Messages the robot has in flight when the server's Python stops: any one of them arriving
#: while the GIL is held is enough; a burst survives a few dropped by congestion control.
BURST = 20
REJECTED = "servo_observations_rejected_total"


@pytest.mark.parametrize("lanes", [1, 2])
async def test_a_server_that_holds_the_gil_for_three_leases_keeps_its_robot(port: int, lanes: int) -> None:
    manifest = make_manifest(port, extra=f"[serving]\nintake_threads = {lanes}")
    robot = ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{port}"], lease_ms=LEASE_MS)
    async with (
        running_server(manifest) as (server, ready),
        PolicyClient.connect(robot, "arm-1") as client,
        client.session(features=ready.info.features, fps=30) as session,
    ):
        await session.infer(np.zeros(6, np.float32), FRAMES, timeout=10)
        # Another robot's key on this robot's link: the server authenticates and drops each one.
        stray = client.zsession.declare_publisher(f"{ready.keys.prefix}/c/stray/obs")

        def rejected() -> float:
            return metric(server, REJECTED, reason="header")

        await keep_sending(
            lambda: stray.put(b"not an observation"), lambda: rejected() >= 1, what="a stray one counted"
        )
        before = rejected()
        for _ in range(BURST):
            stray.put(b"not an observation")
        client.zsession.get(ready.keys.status, lambda reply: None)
        hold_gil(HOLD_S)
        await eventually(lambda: rejected() > before, 10, "the stray observations handled after the hold")
        result = await session.infer(np.ones(6, np.float32), FRAMES, timeout=10)
        assert not session.lost.is_set(), session.lost_reason
        assert result.seq_id == 2
        stray.undeclare()
