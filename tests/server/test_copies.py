"""A copy of a request costs a forward only when its observation never arrived (`servo.server.copies`).

A real in-process server over Zenoh on 127.0.0.1, real clients. The policy's gate holds the
device, so an original is known to be waiting or in its forward when its copy arrives; the
forwards are counted by the policy itself (``served``: the state of every forward).
"""

from __future__ import annotations

import anyio
import pytest
import zenoh

from servo._core import decode_header
from servo.client import ChunkResult, RemoteSession
from servo.server.intake import ObservationIntake
from tests.server.helpers import cameras_of, connected, metric, observation, open_on, server_manifest
from tests.server.policies import GatedPolicy
from tests.support import eventually, lose_chunks, running_server

pytestmark = pytest.mark.anyio

#: Far beyond any wait below: reaching it fails the test, not a timing.
TIMEOUT_S = 30.0


async def held_device(
    policy: GatedPolicy, session: RemoteSession, state: float, cameras: dict[str, tuple[int, int]]
) -> int:
    """Send an observation whose forward blocks at the policy's gate; its seq_id once it is in the forward."""
    policy.armed = True
    seq = await session.send(*observation(state, cameras))
    assert await anyio.to_thread.run_sync(policy.entered.wait, TIMEOUT_S)
    return seq


async def both_answers(session: RemoteSession, seq: int) -> ChunkResult:
    """The request's answer, then its other answer (the copy's or the original's), expected, not refused."""
    result = await session.receive(seq, timeout=TIMEOUT_S)
    await eventually(lambda: session.stats.copy_answers == 1, TIMEOUT_S, "the other answer")
    assert session.stats.dropped_stale == 0
    return result


@pytest.mark.parametrize("where", ["waiting", "in its forward"])
async def test_a_copy_of_a_request_not_answered_yet_joins_it(port: int, where: str) -> None:
    policy = GatedPolicy(cameras={"front": (24, 32)})
    async with (
        running_server(server_manifest(port), policy) as (server, ready),
        connected(port, "arm-1") as first,
        connected(port, "arm-2") as second,
    ):
        cameras = cameras_of(ready)
        busy, robot = await open_on(first, ready), await open_on(second, ready)
        if where == "waiting":
            await held_device(policy, busy, 11.0, cameras)  # another robot's forward holds the device
            original = await robot.send(*observation(22.0, cameras))
            mailbox = server.registry.by_client("arm-2")
            await eventually(lambda: mailbox is not None and mailbox.mailbox is not None, TIMEOUT_S, "it waits")
        else:
            original = await held_device(policy, robot, 22.0, cameras)
        copy = robot.resend()
        await eventually(lambda: metric(server, "servo_copies_total", outcome="joined") == 1, TIMEOUT_S, "the join")
        policy.gate.set()
        result = await both_answers(robot, copy)
        assert result.seq_id in (original, copy)
        assert result.chunk_robot[0, 0] == pytest.approx(22.0)
        assert policy.served.count(22) == 1  # one forward for both
        if where == "waiting":
            await busy.receive(busy.protocol.latest_seq, timeout=TIMEOUT_S)


async def test_a_copy_of_a_request_whose_answer_was_lost_gets_the_answer_again(
    port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    dropped = lose_chunks(monkeypatch, lambda seq: seq == 1)
    policy = GatedPolicy(cameras={"front": (24, 32)})
    async with (
        running_server(server_manifest(port), policy) as (server, ready),
        connected(port, "arm-1") as client,
    ):
        session = await open_on(client, ready)
        seq = await session.send(*observation(33.0, cameras_of(ready)))
        await eventually(lambda: dropped == [1], TIMEOUT_S, "the answer lost on the way back")
        result = await session.receive(seq, timeout=TIMEOUT_S, resend_after=0.0)
        assert result.seq_id == 2
        assert result.chunk_robot[0, 0] == pytest.approx(33.0)
        assert metric(server, "servo_copies_total", outcome="answered") == 1
        assert policy.served.count(33) == 1  # no second forward


async def test_a_copy_whose_original_never_arrived_is_served(port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    lost: list[int] = []
    on_sample = ObservationIntake.on_sample

    def lossy(intake: ObservationIntake, sample: zenoh.Sample) -> None:
        assert sample.attachment is not None
        if decode_header(sample.attachment.to_bytes()).seq_id == 1:
            lost.append(1)  # lost on the way up
            return
        on_sample(intake, sample)

    monkeypatch.setattr(ObservationIntake, "on_sample", lossy)
    policy = GatedPolicy(cameras={"front": (24, 32)})
    async with (
        running_server(server_manifest(port), policy) as (server, ready),
        connected(port, "arm-1") as client,
    ):
        session = await open_on(client, ready)
        result = await session.infer(*observation(44.0, cameras_of(ready)), timeout=TIMEOUT_S, resend_after=0.2)
        assert (lost, result.seq_id) == ([1], 2)
        assert metric(server, "servo_copies_total", outcome="served") == 1
        assert policy.served.count(44) == 1
