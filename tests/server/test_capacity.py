"""Capacity: max_sessions is enforced, with the load in the refusal; reconnects replace."""

from __future__ import annotations

import pytest

from servo.client import SessionRejected
from servo.identity import Identity
from tests.server.helpers import connected, metric, observation, open_on
from tests.server.policies import FixedComputePolicy
from tests.support import eventually, make_manifest, running_server

pytestmark = pytest.mark.anyio


async def test_third_client_is_refused_with_the_load(port: int) -> None:
    manifest = make_manifest(port, extra="[serving]\nmax_sessions = 2\n")
    async with running_server(manifest, policy=FixedComputePolicy()) as (server, ready):
        async with connected(port, "a") as ca, connected(port, "b") as cb, connected(port, "c") as cc:
            sa, sb = await open_on(ca, ready), await open_on(cb, ready)
            with pytest.raises(SessionRejected) as info:
                await open_on(cc, ready)
            rejection = info.value.rejection
            assert rejection.code == "capacity"
            assert "2/2" in rejection.reason
            assert (rejection.active_sessions, rejection.max_sessions, rejection.load) == (2, 2, 1.0)
            # discovery reports the same load, so a client can pick another replica
            (status,) = await cc.discover()
            assert (status.status.active_sessions, status.status.max_sessions, status.status.load) == (2, 2, 1.0)
            # the admitted sessions are unaffected
            await sa.infer(*observation(1), timeout=5)
            await sb.infer(*observation(2), timeout=5)
            # closing one frees its slot at once
            await sb.close()
            assert len(server.registry) == 1
            sc = await open_on(cc, ready)
            await sc.infer(*observation(3), timeout=5)
            await sa.close()
            await sc.close()
        assert metric(server, "servo_sessions_rejected_total", code="capacity") == 1
        assert metric(server, "servo_sessions_opened_total") == 3
        assert metric(server, "servo_active_sessions") == 0


async def test_reconnecting_client_replaces_its_own_session(port: int) -> None:
    """Same client_id, new epoch, new Zenoh session (the robot reconnected): the old session is
    replaced, not added, so a full server still takes it back — but only by its holder: the same
    robot identity, or a client that proves it held the old session."""
    manifest = make_manifest(port, extra="[serving]\nmax_sessions = 2\n")
    async with running_server(manifest, policy=FixedComputePolicy()) as (server, ready):
        async with connected(port, "b") as cb:
            sb = await open_on(cb, ready)
            async with connected(port, "a") as old_client:
                old = await open_on(old_client, ready, epoch=0)
                await old.infer(*observation(1), timeout=5)
                async with connected(port, "a", identity=Identity.generate()) as new_client:
                    # A second open under a live session's name, by another robot, proves nothing: refused.
                    with pytest.raises(SessionRejected) as info:
                        await open_on(new_client, ready, epoch=1)
                    assert info.value.rejection.code == "session_exists"
                    await old.infer(*observation(2), timeout=5)  # untouched
                    # With the proof that it held the old session, the open replaces it.
                    new = await open_on(new_client, ready, epoch=1, previous=old)
                    assert new.session_id != old.session_id
                    assert len(server.registry) == 2
                    assert server.registry.by_client("a").session_id == new.session_id  # type: ignore[union-attr]
                    result = await new.infer(*observation(5), timeout=5)
                    assert result.chunk_robot[0][0] == 5
                    # the old session's observations are dropped, not served into the new session
                    await old.send(*observation(6))
                    await eventually(lambda: metric(server, "servo_observations_rejected_total", reason="session") >= 1)
                    await new.infer(*observation(8), timeout=5)
                    assert old.stats.chunks == 2
                    await old.close()  # its close names a session the server no longer has: harmless
                    assert server.registry.by_client("a").session_id == new.session_id  # type: ignore[union-attr]
                # new_client closed without a word: its token vanishes, so a restarted "a" may take over
                await eventually(lambda: server.registry.by_client("a").token_lost)  # type: ignore[union-attr]
            async with connected(port, "a") as again:
                third = await open_on(again, ready, epoch=2)
                await third.infer(*observation(7), timeout=5)
                assert len(server.registry) == 2
                # The same robot again (it restarted, its old session still live): replaced at once.
                fourth = await open_on(again, ready, epoch=3)
                await fourth.infer(*observation(9), timeout=5)
                assert server.registry.by_client("a").session_id == fourth.session_id  # type: ignore[union-attr]
                assert len(server.registry) == 2
                await fourth.close()
            await sb.infer(*observation(2), timeout=5)
            await sb.close()
        assert (
            metric(server, "servo_sessions_collected_total", reason="replaced") == 3
        )  # the proof, the restart, the same robot
        assert metric(server, "servo_sessions_rejected_total", code="session_exists") == 1
        assert metric(server, "servo_sessions_rejected_total", code="capacity") == 0


async def test_exclusive_mode_serves_one_session(port: int) -> None:
    policy = FixedComputePolicy(chunk_stateless=False)
    async with running_server(make_manifest(port), policy=policy) as (server, ready):
        assert ready.info.serving_mode == "exclusive"
        # Capacity is decided once, with the serving mode: status, metrics and admission agree.
        assert metric(server, "servo_max_sessions") == 1
        async with connected(port, "a") as ca, connected(port, "b") as cb:
            (info,) = await ca.discover()
            assert (info.status.max_sessions, info.status.policy.serving_mode) == (1, "exclusive")
            sa = await open_on(ca, ready)
            with pytest.raises(SessionRejected) as info:
                await open_on(cb, ready)
            assert info.value.rejection.code == "capacity"
            assert info.value.rejection.max_sessions == 1
            await sa.infer(*observation(1), timeout=5)
            resets = policy.resets
            await sa.reset(1)
            await sa.infer(*observation(1), timeout=5)
            # exclusive mode also resets the (chunk-stateful) policy at the episode boundary
            assert policy.resets == resets + 1
            # An observation of a new episode that overtakes its reset request resets as well.
            sa.episode_id = 2
            await sa.infer(*observation(1), timeout=5)
            assert policy.resets == resets + 2
            await sa.reset(2)
            await sa.infer(*observation(1), timeout=5)
            assert policy.resets == resets + 2, "the late reset request must not reset mid-episode"
            await sa.close()
            # The next robot's first observation starts from a clean policy, whatever it saw before.
            await eventually(lambda: len(server.registry) == 0)
            sb = await open_on(cb, ready)
            await sb.infer(*observation(1), timeout=5)
            assert policy.resets == resets + 3
            await sb.close()
        assert len(server.registry) == 0
