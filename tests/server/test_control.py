"""Control plane: reset (acked, episode-aware), close, and refusals for unknown sessions."""

from __future__ import annotations

import pytest

from servo.client import ServerError
from servo.transport import query
from servo.wire import CloseRequest, ControlAck, Rejection, ResetRequest, decode, encode
from tests.server.helpers import action_tap, connected, eventually, metric, obs_header, observation, open_on
from tests.server.policies import FixedComputePolicy
from tests.server.test_malformed import body
from tests.support import make_manifest, running_server

pytestmark = pytest.mark.anyio


async def test_reset_is_acked_and_old_episode_observations_are_dropped(port: int) -> None:
    policy = FixedComputePolicy()
    async with (
        running_server(make_manifest(port), policy=policy) as (server, ready),
        connected(port, "robot") as client,
    ):
        session = await open_on(client, ready)
        first = await session.infer(*observation(1), timeout=5)
        assert first.episode_id == 0
        resets_before = policy.resets
        await session.reset(1)  # returns only once the server acknowledged
        assert server.registry.by_client("robot").episode_id == 1  # type: ignore[union-attr]
        async with action_tap(client.zsession, session.keys.action) as tap:
            # a straggler of episode 0 arriving after the reset is dropped, never served
            client.zsession.put(session.keys.obs, body(), attachment=obs_header(session, 999, episode_id=0))
            await eventually(lambda: metric(server, "servo_dropped_observations_total", reason="stale") == 1)
            second = await session.infer(*observation(2), timeout=5)
            assert second.episode_id == 1
            assert second.chunk_robot[0][0] == 2
            assert all(h is None or h.seq_id != 999 for h, _ in tap.seen)
        # shared mode never resets the (shared) policy itself
        assert policy.resets == resets_before
        await session.close()


async def test_reset_ack_on_the_wire(port: int) -> None:
    async with (
        running_server(make_manifest(port), policy=FixedComputePolicy()) as (_, ready),
        connected(port, "robot") as client,
    ):
        session = await open_on(client, ready)
        (reply,) = await query(
            client.zsession, session.keys.control, payload=encode(ResetRequest(session.session_id, 4)), timeout=2
        )
        assert reply.ok is not None
        assert decode(reply.ok.payload.to_bytes(), ControlAck) == ControlAck(session.session_id, 4)
        await session.close()


async def test_close_frees_capacity_and_unknown_sessions_are_refused(port: int) -> None:
    manifest = make_manifest(port, extra="[serving]\nmax_sessions = 1\n")
    async with (
        running_server(manifest, policy=FixedComputePolicy()) as (server, ready),
        connected(port, "a") as ca,
        connected(port, "b") as cb,
    ):
        sa = await open_on(ca, ready)
        await sa.infer(*observation(1), timeout=5)
        stale_id = sa.session_id
        await sa.close()
        assert len(server.registry) == 0
        assert metric(server, "servo_sessions_collected_total", reason="closed") == 1
        sb = await open_on(cb, ready)  # the slot is free again
        await sb.infer(*observation(2), timeout=5)
        # reset / close of a session that no longer exists: refused, named
        with pytest.raises(ServerError) as info:
            await sa.reset(1)
        assert info.value.code == "unknown_session"
        assert str(stale_id) in info.value.message
        (reply,) = await query(ca.zsession, sa.keys.control, payload=encode(CloseRequest(stale_id)), timeout=2)
        assert reply.err is not None
        assert decode(reply.err.payload.to_bytes(), Rejection).code == "unknown_session"
        # another client cannot reset or close b's session through its own key
        (reply,) = await query(ca.zsession, sa.keys.control, payload=encode(ResetRequest(sb.session_id, 1)), timeout=2)
        assert reply.err is not None
        assert decode(reply.err.payload.to_bytes(), Rejection).code == "unknown_session"
        assert server.registry.get(sb.session_id) is not None
        result = await sb.infer(*observation(3), timeout=5)
        assert result.episode_id == 0
        await sb.close()
