"""A busy client keeps its session: nothing on Zenoh's receive path waits for the GIL.

Zenoh closes a link when nothing was read from it for the peer's lease, and its receive task
runs the callbacks of the samples it reads. A callback run there (``Callback(indirect=False)``)
must take the GIL first: in a process that holds the GIL longer than the lease (at load 20 on
2 cores a starved thread holds it for seconds), the link expired while the server was sending,
its liveliness token vanished and the session was abandoned ("server liveliness lost").

Here a process holds the GIL for three leases while another peer publishes on the session's
action key every 10 ms; the session must survive and answer the next request.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from servo.client import PolicyClient
from testbed.processes import stop
from tests.support import client_settings, eventually, hold_gil, make_manifest, running_server

pytestmark = pytest.mark.anyio

LEASE_MS = 500
HOLD_S = 3 * LEASE_MS / 1000
FRAMES = {"front": np.zeros((48, 64, 3), np.uint8)}

#: Another process: puts a message that no session accepts on ``key`` every 10 ms.
_SPAMMER = """
import json, sys, time, zenoh
conf = zenoh.Config()
for k, v in {"mode": "client", "connect/endpoints": [sys.argv[1]], "scouting/multicast/enabled": False,
             "transport/shared_memory/enabled": False}.items():
    conf.insert_json5(k, json.dumps(v))
with zenoh.open(conf) as z:
    pub = z.declare_publisher(sys.argv[2])
    print("ready", flush=True)
    while True:
        pub.put(b"not a chunk", attachment=b"not sealed")
        time.sleep(0.01)
"""


@contextmanager
def spamming(port: int, key: str) -> Iterator[None]:
    command = [sys.executable, "-c", _SPAMMER, f"tcp/127.0.0.1:{port}", key]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            yield
        finally:
            stop(proc, grace_s=5)


async def test_a_client_that_holds_the_gil_for_three_leases_keeps_its_session(port: int) -> None:
    manifest = make_manifest(port, zenoh=f"lease_ms = {LEASE_MS}")
    async with (
        running_server(manifest) as (_, ready),
        PolicyClient.connect(client_settings(port), "arm-1") as client,
        client.session(features=ready.info.features, fps=30) as session,
    ):
        await session.infer(np.zeros(6, np.float32), FRAMES, timeout=10)
        with spamming(port, session.keys.action):
            refused = client.statistics
            await eventually(lambda: sum(refused().chunks_rejected.values()) >= 5, 10, "the spam reaching the session")
            hold_gil(HOLD_S)
            result = await session.infer(np.ones(6, np.float32), FRAMES, timeout=10)
        assert not session.lost.is_set(), session.lost_reason
        assert result.seq_id == 2
