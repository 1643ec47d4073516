"""Nobody holds a slot, or a robot's name, that it does not use or own.

Issue 18, on a flat network: eight squatted slots kept alive past the 60 s idle eviction still
held at 70 s (control requests counted as activity), and taking a robot's name before it starts
refused the robot (``session_exists``). Now only authenticated observations keep a session alive,
and a server that enrols its robots binds each name to its robot's identity, refusing strangers
before they take a slot or any budget.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import pytest

from servo.client import PolicyClient, RemoteSession, SessionRejected
from servo.identity import Identity, load_identity, robot_identity
from servo.server.service import ServerReady
from servo.wire import fingerprint
from tests.security.peers import edge_rig, peer_settings, sim_policy_spec
from tests.server.helpers import metric, open_on
from tests.server.policies import FixedComputePolicy
from tests.support import eventually, make_manifest, running_server

pytestmark = pytest.mark.anyio

#: The edge's per-request watchdog in the rig (`tests.edge.harness.edge_config` leaves the default).
REQUEST_TIMEOUT_S = 5.0
IDLE_S = 2.0


@asynccontextmanager
async def squatting(port: int, ready: ServerReady, names: list[str]) -> AsyncIterator[list[RemoteSession]]:
    """Sessions that hold slots and do everything but stream: a liveliness token each, and a
    sealed, acknowledged reset every 0.2 s (the squat of issue 18), each under its own identity."""
    async with AsyncExitStack() as stack:
        sessions = []
        for name in names:
            client = await stack.enter_async_context(
                PolicyClient.connect(peer_settings(port), name, identity=Identity.generate())
            )
            sessions.append(await open_on(client, ready))

        async def keep_resetting(session: RemoteSession) -> None:
            episode = 0
            while not session.lost.is_set():
                episode += 1
                try:
                    await session.reset(episode)
                except Exception:  # collected: the server no longer knows the session
                    return
                await anyio.sleep(0.2)

        async with anyio.create_task_group() as tg:
            for session in sessions:
                tg.start_soon(keep_resetting, session)
            yield sessions
            tg.cancel_scope.cancel()


async def test_a_squatter_that_only_resets_is_evicted_and_a_new_robot_gets_in(port: int, tmp_path: Path) -> None:
    manifest = make_manifest(port, extra=f"[serving]\nmax_sessions = 4\n[limits]\nidle_session_s = {IDLE_S}\n")
    policy = FixedComputePolicy(**sim_policy_spec(chunk_size=20))
    newcomer_key = tmp_path / "robot-8.key"  # a robot new to the server: no open budget of a returning one
    async with running_server(manifest, policy) as (server, ready), edge_rig(port, tmp_path) as rig:
        await eventually(lambda: rig.engine.chunks_received >= 3, 15, "robot-7 streaming")
        first = rig.engine.session
        async with squatting(port, ready, ["squat-1", "squat-2", "squat-3"]):
            squat_started = time.monotonic_ns()
            assert len(server.registry) == 4  # full
            # robot-8 is refused while the squatters hold the slots, and retries until they are gone.
            async with edge_rig(
                port, tmp_path, "robot-8", identity_key=str(newcomer_key), connect_timeout_s=30.0
            ) as robot8:
                await eventually(lambda: robot8.engine.chunks_received >= 3, 30, "robot-8 streaming")
                squat_ended = time.monotonic_ns()
        assert rig.engine.session is first  # robot-7 streamed through it all, untouched
    assert metric(server, "servo_sessions_collected_total", reason="idle") >= 3  # despite their resets
    assert metric(server, "servo_sessions_rejected_total", code="capacity") >= 1  # robot-8 waited for room
    # Within the bound: idle_session_s, a sweep (a quarter of it), and a reconnect backoff.
    assert (squat_ended - squat_started) / 1e9 < IDLE_S * 1.25 + REQUEST_TIMEOUT_S
    assert rig.summary.final_state == "streaming"
    assert rig.merges.longest_gap_s(squat_started, squat_ended) < REQUEST_TIMEOUT_S


@pytest.mark.parametrize("enrolment", ["manifest", "fleet file"])
async def test_an_enrolled_robots_name_cannot_be_squatted(port: int, tmp_path: Path, enrolment: str) -> None:
    robot7 = fingerprint(robot_identity().public_key)  # what `servo-edge --identity` prints on robot-7
    if enrolment == "manifest":
        security = f'[security]\nrobots = [{{name = "robot-7", identity = "{robot7}"}}]\n'
    else:
        fleet = tmp_path / "fleet.toml"
        fleet.write_text(
            '[router]\nlisten = ["tcp/127.0.0.1:7447"]\npasswords_file = "fleet.passwords"\n'
            f'[[robots]]\nnames = ["robot-7"]\nidentities = {{robot-7 = "{robot7}"}}\n'
        )
        security = f'[security]\nfleet = "{fleet}"\n'
    manifest = make_manifest(port, extra=security)
    policy = FixedComputePolicy(**sim_policy_spec(chunk_size=20))
    async with (
        running_server(manifest, policy) as (server, ready),
        PolicyClient.connect(peer_settings(port), "robot-7", identity=Identity.generate()) as squatter,
        PolicyClient.connect(peer_settings(port), "stranger", identity=Identity.generate()) as stranger,
    ):
        # Before robot-7 ever starts: its name under another identity, and a stranger, both refused.
        for intruder in (squatter, stranger):
            with pytest.raises(SessionRejected) as info:
                await open_on(intruder, ready)
            assert info.value.rejection.code == "unauthenticated"
        assert len(server.registry) == 0  # no slot taken
        async with edge_rig(port, tmp_path) as rig:
            await eventually(lambda: rig.engine.chunks_received >= 3, 15, "robot-7 streaming")
            attack_started = time.monotonic_ns()
            for _ in range(20):  # the squatter keeps at it: refused each time, spending no budget of robot-7's
                with pytest.raises(SessionRejected):
                    await open_on(squatter, ready)
            (session,) = server.registry.snapshot()
            server.state.collect(session, "idle")  # dropped by the server: robot-7 must get back in at once
            await eventually(lambda: server.registry.by_client("robot-7") is not None, REQUEST_TIMEOUT_S, "back")
            received = rig.engine.chunks_received
            await eventually(lambda: rig.engine.chunks_received >= received + 2, 15, "streaming again")
            attack_ended = time.monotonic_ns()
    assert metric(server, "servo_sessions_rejected_total", code="unauthenticated") == 22
    assert metric(server, "servo_sessions_rejected_total", code="rate_limited") == 0
    assert rig.summary.final_state == "streaming"
    assert rig.merges.longest_gap_s(attack_started, attack_ended) < REQUEST_TIMEOUT_S


def test_an_identity_key_file_names_the_robot_it_is(tmp_path: Path) -> None:
    """``identity_key`` gives one machine's robots their own identities (robot-8 above)."""
    path = tmp_path / "robot-8.key"
    assert robot_identity(path).public_key == load_identity(path).public_key != robot_identity().public_key
