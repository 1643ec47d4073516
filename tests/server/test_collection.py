"""Liveliness: a vanished client's session is collected after the grace period, a live one never."""

from __future__ import annotations

import time

import anyio
import pytest

from servo._core import KeyPair
from servo.transport import query
from servo.wire import SUPPORTED_SCHEMA_VERSIONS, SessionAck, SessionOpen, decode, encode
from tests.server.helpers import connected, metric, observation, open_on, signed
from tests.server.policies import FixedComputePolicy
from tests.support import make_manifest, running_server

pytestmark = pytest.mark.anyio

GRACE_S = 0.2


async def test_vanished_client_is_collected_and_live_one_kept(port: int) -> None:
    manifest = make_manifest(port, extra=f"[serving]\nclient_grace_s = {GRACE_S}\n")
    async with running_server(manifest, policy=FixedComputePolicy()) as (server, ready):
        async with connected(port, "stays") as staying:
            kept = await open_on(staying, ready)
            async with connected(port, "vanishes") as vanishing:
                gone = await open_on(vanishing, ready)
                await gone.infer(*observation(1), timeout=5)
                assert len(server.registry) == 2
                # Leaving this block closes the Zenoh session abruptly: no CloseRequest is sent.
                # Stamped before the close: under load the close returns well after its token's
                # DELETE reached the server, and the grace runs from there.
                vanished_at = time.monotonic()
            with anyio.fail_after(5):
                await server.wait_sessions(lambda sessions: len(sessions) == 1)
            assert time.monotonic() - vanished_at >= GRACE_S * 0.9
            assert server.registry.by_client("vanishes") is None
            assert metric(server, "servo_sessions_collected_total", reason="vanished") == 1
            assert metric(server, "servo_active_sessions") == 1
            # the live client outlived the grace period and is still served
            result = await kept.infer(*observation(2), timeout=5)
            assert result.chunk_robot[0][0] == 2
            await kept.close()
        assert metric(server, "servo_sessions_collected_total", reason="closed") == 1


async def test_live_client_outlives_the_grace_period(port: int) -> None:
    """Regression: the client's liveliness token arrives before its session exists; the session
    must still count as alive and never be collected while the robot is there."""
    manifest = make_manifest(port, extra=f"[serving]\nclient_grace_s = {GRACE_S}\n")
    async with (
        running_server(manifest, policy=FixedComputePolicy()) as (server, ready),
        connected(port, "robot") as client,
    ):
        session = await open_on(client, ready)
        started = time.monotonic()
        while time.monotonic() - started < 3 * GRACE_S:
            await session.infer(*observation(1), timeout=5)
        assert len(server.registry) == 1
        assert metric(server, "servo_sessions_collected_total", reason="vanished") == 0
        await session.close()


async def test_session_without_liveliness_token_is_collected(port: int) -> None:
    """A session opened by hand (no token ever declared) is collected like a vanished client."""
    manifest = make_manifest(port, extra=f"[serving]\nclient_grace_s = {GRACE_S}\n")
    async with (
        running_server(manifest, policy=FixedComputePolicy()) as (server, ready),
        connected(port, "robot") as client,
    ):
        request = SessionOpen(
            client_id="tokenless",
            schema_versions=list(SUPPORTED_SCHEMA_VERSIONS),
            features=ready.info.features,
            fps=ready.info.fps,
            client_key=KeyPair().public_key,
        )
        request = await signed(client, ready, request)
        key = ready.keys.client("tokenless").session
        (reply,) = await query(client.zsession, key, payload=encode(request), timeout=2)
        assert reply.ok is not None
        decode(reply.ok.payload.to_bytes(), SessionAck)
        assert len(server.registry) == 1
        with anyio.fail_after(5):
            await server.wait_sessions(lambda sessions: not sessions)
        assert metric(server, "servo_sessions_collected_total", reason="vanished") == 1
