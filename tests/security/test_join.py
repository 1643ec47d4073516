"""Off loopback only enrolled robots get in, and a robot enrols itself with the token the server printed.

Issue 29: on a ``tls/0.0.0.0`` server with no robots enrolled (the default), a stranger copied the
self-signed certificate from the handshake, joined as a Zenoh peer and opened 16 sessions in 750
tries. Now the same set-up admits only enrolled robots; ``servo-serve`` prints a join token in the
robot's command, good once, for a while, and bound to the open that proves it.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import msgspec
import pytest

from servo.cli.console import Console
from servo.cli.lifecycle import first_error
from servo.cli.robots import main as robots_cli
from servo.client import SessionRejected
from servo.client.trust import signed_open
from servo.edge.errors import EdgeStartError
from servo.home import roster_path
from servo.identity import Identity, server_identity
from servo.join import JoinToken
from servo.server.joins import issue, revoke_token
from servo.server.roster import Roster
from servo.transport import query
from servo.wire import SUPPORTED_SCHEMA_VERSIONS, Rejection, SessionAck, SessionOpen, decode, encode
from tests.security.lan import certificate_of, lan_client, lan_server, robot_files
from tests.security.peers import EdgeRig, edge_rig
from tests.server.helpers import open_on
from tests.support import eventually, free_port

pytestmark = [pytest.mark.anyio, pytest.mark.wildcard]

REQUEST_TIMEOUT_S = 5.0


async def test_a_stranger_opens_nothing_on_a_lan_server_while_a_joined_robot_streams(tmp_path: Path) -> None:
    port = free_port()
    async with lan_server(port, serving="max_sessions = 16") as (server, ready):
        assert ready.closed
        assert ready.join_token
        async with edge_rig(
            port,
            tmp_path,
            "robot-7",
            connect=[f"tls/127.0.0.1:{port}"],
            join=ready.join_token,
            **robot_files(tmp_path, "robot-7"),
        ) as rig:
            await eventually(lambda: rig.engine.chunks_received >= 3, 30, "the joined robot streaming")
            attack_started = time.monotonic_ns()
            refused = []
            for attempt in range(16):
                # A fresh identity each time, the certificate copied, the server's identity pinned.
                async with lan_client(server, port, tmp_path, f"stranger-{attempt}") as stranger:
                    with pytest.raises(SessionRejected) as caught:
                        await open_on(stranger, ready)
                    refused.append(caught.value.rejection)
            received = rig.engine.chunks_received
            await eventually(lambda: rig.engine.chunks_received >= received + 3, 30, "streaming through it")
            attack_ended = time.monotonic_ns()
            assert [s.client_id for s in server.registry.snapshot()] == ["robot-7"]
    assert {r.code for r in refused} == {"unauthenticated"}
    assert all("is not enrolled on this server" in r.reason for r in refused)
    assert rig.summary.final_state == "streaming"
    assert rig.merges.longest_gap_s(attack_started, attack_ended) < REQUEST_TIMEOUT_S


async def test_a_token_enrols_one_robot_and_is_refused_to_the_next_naming_why(tmp_path: Path) -> None:
    port = free_port()
    async with lan_server(port) as (server, ready):
        async with lan_client(server, port, tmp_path, "robot-7", join=ready.join_token) as robot7:
            first = await open_on(robot7, ready)
            await first.close()
            again = await open_on(robot7, ready)  # the same command again: enrolled, the token ignored
            await again.close()
        async with lan_client(server, port, tmp_path, "robot-8", join=ready.join_token) as robot8:
            with pytest.raises(SessionRejected) as refused:
                await open_on(robot8, ready)
    token_id = JoinToken.parse(ready.join_token).id
    assert refused.value.rejection.code == "unauthenticated"
    assert f"join token {token_id} was used already (by 'robot-7')" in refused.value.rejection.reason
    assert "\n" not in refused.value.rejection.reason


def issued(ttl_s: float, *, uses: int = 1, age_s: float = 0.0, revoked: bool = False) -> JoinToken:
    """A token of this machine's server (its identity made now if new), kept in its roster."""
    roster = Roster(roster_path("default"))
    identity = server_identity("", "default").public_key
    token = roster.change(
        lambda f: issue(f, JoinToken.issue(identity), ttl_s=ttl_s, uses=uses, now=time.time() - age_s)
    )
    if revoked:
        roster.change(lambda f: revoke_token(f, token.id))
    return token


async def test_expired_revoked_and_unknown_tokens_are_refused_naming_why(tmp_path: Path) -> None:
    expired, revoked = issued(60, age_s=600), issued(600, revoked=True)
    unknown = JoinToken.issue(server_identity("", "default").public_key)
    port = free_port()
    reasons = {}
    async with lan_server(port) as (server, ready):
        for name, token in (("expired", expired), ("revoked", revoked), ("unknown", unknown)):
            async with lan_client(server, port, tmp_path, f"robot-{name}", join=str(token)) as robot:
                with pytest.raises(SessionRejected) as refused:
                    await open_on(robot, ready)
                reasons[name] = refused.value.rejection.reason
    assert f"join token {expired.id} expired 9 min ago" in reasons["expired"]
    assert f"join token {revoked.id} was revoked" in reasons["revoked"]
    assert f"join token {unknown.id} is not known to this server" in reasons["unknown"]


async def test_a_captured_join_open_is_worth_nothing_to_anyone_else(tmp_path: Path) -> None:
    """The proof is bound to the open: replayed it is a replay, moved to another key it does not verify."""
    token = issued(600, uses=2)
    roster = Roster(roster_path("default"))
    port = free_port()
    async with lan_server(port) as (server, ready), lan_client(server, port, tmp_path, "robot-7") as robot7:
        (info,) = [s for s in await robot7.discover() if s.keys == ready.keys]
        keys = ready.keys.client("robot-7")

        async def send(request: SessionOpen) -> SessionAck | Rejection:
            (reply,) = await query(robot7.zsession, keys.session, payload=encode(request), timeout=5)
            if reply.ok is not None:
                return decode(reply.ok.payload.to_bytes(), SessionAck)
            assert reply.err is not None
            return decode(reply.err.payload.to_bytes(), Rejection)

        versions = list(SUPPORTED_SCHEMA_VERSIONS)
        base = SessionOpen("robot-7", versions, ready.info.features, ready.info.fps, Identity.generate().public_key)
        captured = signed_open(base, robot7.identity, prefix=ready.keys.prefix, nonce=info.status.nonce, join=token)
        await eventually(lambda: server.state.lifecycle == "serving", 5)
        assert isinstance(await send(captured), SessionAck)
        replayed = await send(captured)
        assert isinstance(replayed, Rejection)
        assert "a replay" in replayed.reason
        # Mallory keeps robot-7's proof, signs the rest as herself under a name of her own.
        mallory = Identity.generate()
        moved = signed_open(
            msgspec.structs.replace(base, client_id="mallory", client_key=Identity.generate().public_key),
            mallory,
            prefix=ready.keys.prefix,
            nonce=info.status.nonce,
            join=None,
        )
        moved = msgspec.structs.replace(moved, join_id=token.id, join_signature=captured.join_signature)
        (reply,) = await query(robot7.zsession, ready.keys.client("mallory").session, payload=encode(moved), timeout=5)
        assert reply.err is not None
        refused = decode(reply.err.payload.to_bytes(), Rejection)
    assert refused.code == "unauthenticated"
    assert "does not verify" in refused.reason
    assert [r.name for r in roster.read().robots] == ["robot-7"]
    assert roster.read().token(token.id).uses == 1  # type: ignore[union-attr]  # mallory spent nothing


async def test_enrolments_survive_a_restart_and_revocation_closes_a_running_robot(tmp_path: Path) -> None:
    port = free_port()
    async with (
        lan_server(port) as (server, ready),
        lan_client(server, port, tmp_path, "robot-7", join=ready.join_token) as robot7,
    ):
        await (await open_on(robot7, ready)).close()
    # The same robot without a token after a restart: it is enrolled already.
    async with lan_server(port) as (server, ready), lan_client(server, port, tmp_path, "robot-7") as robot7:
        session = await open_on(robot7, ready)
        assert robots_cli(["revoke", "robot-7"], Console(live=False)) == 0
        await eventually(lambda: session.lost.is_set(), 15, "the revoked robot's session closed")
        with pytest.raises(SessionRejected) as refused:
            await open_on(robot7, ready)
    assert "robot 'robot-7'" in refused.value.rejection.reason
    assert "is not enrolled on this server" in refused.value.rejection.reason


async def first_contact(port: int, tmp_path: Path, certificate: str, token: JoinToken) -> EdgeRig:
    """robot-7 started with ``token`` on whatever answers at ``port``; the rig, after it stopped."""
    async with edge_rig(
        port,
        tmp_path,
        "robot-7",
        connect=[f"tls/127.0.0.1:{port}"],
        tls_root_ca=certificate,
        join=str(token),
        connect_timeout_s=3.0,
        **robot_files(tmp_path, "robot-7"),
    ) as rig:
        with anyio.fail_after(30):
            await rig.run.done.wait()
    return rig


async def test_a_rogue_server_alone_at_first_contact_is_refused_by_a_robot_that_joined(tmp_path: Path) -> None:
    """Issue 29: a rogue server alone at a robot's first contact was trusted for good (270 ticks at
    its targets). The token carries the real server's identity: the rogue is never used."""
    token = JoinToken.issue(Identity.generate().public_key)  # the real server's, elsewhere
    port = free_port()
    async with lan_server(port) as (rogue, _):
        with pytest.raises(BaseExceptionGroup) as caught:
            await first_contact(port, tmp_path, certificate_of(rogue), token)
        assert rogue.registry.snapshot() == []
    refused = first_error(caught.value)
    assert isinstance(refused, EdgeStartError)
    assert "no replica of */* has the identity trusted for it" in str(refused)
