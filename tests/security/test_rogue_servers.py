"""A peer posing as a policy server is skipped and counted, never used.

Issue 8: a fake replica reporting ``load = -1`` won discovery and the edge ran its commands for
the whole run; one status reply with invalid UTF-8 stopped edges from starting.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest
import zenoh

from servo._core import ServerIdentity
from servo.client import PolicyClient
from servo.client.known import KnownServers, deployment
from servo.edge.errors import EdgeStartError
from servo.edge.remote import RemoteEngine
from servo.wire import MAX_STATUS_BYTES, ServerKeys, SessionAck, SessionOpen, StatusReply, encode, parse_fingerprint
from tests.edge.harness import MergeLog, edge_config, first_error, running_edge, small_sim
from tests.security.peers import RogueReplica, closing, edge_rig, peer_settings, sim_policy_spec, with_status
from tests.server.policies import FixedComputePolicy
from tests.support import eventually, make_manifest, running_server

pytestmark = pytest.mark.anyio

#: The real replica's id; every rogue's sorts before it, so it is tried first on equal load.
REAL = "r-real"
SERVING = f'[serving]\nreplica = "{REAL}"\n'
HOSTILE = 66.6
#: The edge's per-request watchdog in the rig (`tests.edge.harness.edge_config` leaves the default).
REQUEST_TIMEOUT_S = 5.0


def rogue_keys(ready_keys: ServerKeys, replica: str = "a-rogue") -> ServerKeys:
    return ServerKeys(ready_keys.app, ready_keys.model, replica)


def poisoned_status(status: StatusReply) -> bytes:
    """A genuine status whose server id is invalid UTF-8."""
    return encode(status).replace(b"\xa5rogue", b"\xa5\xff\xfe\xfd\xfc\xfb")


def hostile_rogue(z: zenoh.Session, keys: ServerKeys) -> RogueReplica:
    """A rogue replica with a working handshake under its own valid identity, sending HOSTILE chunks."""
    return RogueReplica(
        z, keys, chunks=lambda seq: np.full((20, 6), HOSTILE, np.float32), identity=ServerIdentity.generate()
    )


POISONED = {
    "load -1": with_status(load=-1.0),
    "load NaN": with_status(load=float("nan")),
    "more sessions than capacity": with_status(active_sessions=9, max_sessions=8),
    "invalid UTF-8": poisoned_status,
    "not msgpack": lambda status: b"\xc1\xc1garbage",
    "identity of 3 bytes": with_status(identity=b"abc"),
    # Valid in every field but larger than a status may be (anyone on the link may answer).
    "over MAX_STATUS_BYTES": with_status(schema_versions=[3] * (MAX_STATUS_BYTES + 1)),
}


async def test_poisoned_status_replies_are_skipped_with_one_warning(
    port: int, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="servo")
    policy = FixedComputePolicy(**sim_policy_spec(chunk_size=20))
    async with (
        running_server(make_manifest(port, extra=SERVING), policy) as (_, ready),
        PolicyClient.connect(peer_settings(port), "mallory") as mallory,
    ):
        rogues = [
            RogueReplica(mallory.zsession, rogue_keys(ready.keys, f"a-rogue-{i}"), status=status)
            for i, status in enumerate(POISONED.values())
        ]
        with closing(*rogues):
            async with PolicyClient.connect(peer_settings(port), "robot-9") as client:
                for _ in range(3):
                    servers = await client.discover()
                    assert [s.keys.replica for s in servers] == [REAL]
                assert client.statistics().undecodable_status == 3 * len(POISONED)
            async with edge_rig(port, tmp_path) as rig:
                await eventually(lambda: rig.engine.chunks_received >= 2, 15, "streaming from the real server")
    assert rig.summary.final_state == "streaming"
    assert all(r.opens == 0 for r in rogues)
    warnings = [r for r in caplog.records if "undecodable status" in str(r.msg)]
    # One line per second at most, with the count of the lines held back; never a traceback.
    assert 1 <= len(warnings) <= 3
    assert not any(r.exc_info for r in caplog.records)


def unsigned(request: SessionOpen, genuine: SessionAck) -> SessionAck:
    return msgspec.structs.replace(genuine, signature=bytes(64))


def claims_real_identity(real: bytes) -> object:
    def ack(request: SessionOpen, genuine: SessionAck) -> SessionAck:
        return msgspec.structs.replace(genuine, server_identity=real)  # signed by its own key, though

    return ack


@pytest.mark.parametrize("forgery", ["unsigned", "signed by another identity", "claims the real identity"])
async def test_a_rogue_ack_is_skipped_and_the_next_replica_used(port: int, tmp_path: Path, forgery: str) -> None:
    """The rogue copies the real replica's identity into its status (empty, so the edge's first
    choice) and answers the session open; its ack cannot be signed by that identity."""
    policy = FixedComputePolicy(**sim_policy_spec(chunk_size=20))
    async with (
        running_server(make_manifest(port, extra=SERVING), policy) as (server, ready),
        PolicyClient.connect(peer_settings(port), "mallory") as mallory,
    ):
        # The real replica holds a session already: the rogue, empty, is the better place by far.
        (genuine,) = await mallory.discover()
        busy = await mallory.open_session(genuine, features=genuine.status.policy.features, fps=30.0)
        real = parse_fingerprint(ready.fingerprint)
        acks = {
            "unsigned": unsigned,
            "signed by another identity": lambda request, genuine: genuine,
            "claims the real identity": claims_real_identity(real),
        }
        rogue = RogueReplica(
            mallory.zsession,
            rogue_keys(ready.keys),
            status=with_status(identity=real),
            ack=acks[forgery],  # type: ignore[arg-type]
            chunks=lambda seq: np.full((20, 6), HOSTILE, np.float32),
        )
        with closing(rogue):
            async with edge_rig(port, tmp_path) as rig:
                await eventually(lambda: rig.engine.chunks_received >= 3, 15, "streaming from the real server")
                assert rig.engine.server is not None
                assert rig.engine.server.keys.replica == REAL
                (session,) = [s for s in server.registry.snapshot() if s.client_id != "mallory"]
        await busy.close()
    assert rogue.opens >= 1
    assert rig.summary.rogue_servers >= 1
    assert rig.summary.final_state == "streaming"
    assert {m.session_id for m in rig.merges.merges} == {session.session_id}
    assert not any(np.isclose(m.chunk_robot, HOSTILE).any() for m in rig.merges.merges)


@pytest.mark.parametrize("pin", ["fingerprint", "replica id"])
async def test_a_pinned_edge_never_opens_an_untrusted_replica(port: int, tmp_path: Path, pin: str) -> None:
    """A rogue with a working handshake of its own (and chunks to match) is not even asked."""
    policy = FixedComputePolicy(**sim_policy_spec(chunk_size=20))
    async with (
        running_server(make_manifest(port, extra=SERVING), policy) as (_, ready),
        PolicyClient.connect(peer_settings(port), "mallory") as mallory,
    ):
        rogue = hostile_rogue(mallory.zsession, rogue_keys(ready.keys))
        trusted = [ready.fingerprint] if pin == "fingerprint" else [REAL]
        with closing(rogue):
            async with edge_rig(port, tmp_path, trusted_servers=trusted) as rig:
                await eventually(lambda: rig.engine.chunks_received >= 3, 15, "streaming from the real server")
    assert rogue.opens == 0
    assert rig.summary.rogue_servers >= 1  # its status was seen and refused
    assert not any(np.isclose(m.chunk_robot, HOSTILE).any() for m in rig.merges.merges)


async def test_an_edge_that_trusts_nobody_answering_does_not_start(port: int) -> None:
    """Pinned to an identity nobody holds: no replica is usable, the edge refuses to move."""
    policy = FixedComputePolicy(**sim_policy_spec(chunk_size=20))
    stranger = "ed25519:" + "A" * 43
    async with running_server(make_manifest(port, extra=SERVING), policy):
        sim = small_sim()
        engine = RemoteEngine(edge_config(port, connect_timeout_s=1.0, trusted_servers=[stranger]), sim.spec())
        async with running_edge(sim, engine) as run:
            with pytest.raises(BaseException) as info:
                await run.stop()
    error = first_error(info.value)
    assert isinstance(error, EdgeStartError)
    assert "no usable servo server" in str(error)
    assert engine.client is not None
    assert engine.client.statistics().rogue_servers >= 1


@pytest.mark.parametrize("replica", ["a-rogue", REAL], ids=["under a new replica id", "under the real replica id"])
async def test_a_rogue_with_its_own_valid_identity_never_drives_an_unpinned_edge(
    port: int, tmp_path: Path, replica: str
) -> None:
    """Issue 18: a rogue with its own valid Ed25519 identity, a correct handshake and load 0 drove
    an unpinned edge for 211 ticks (207 under the real replica id). The edge trusted the real
    server on first contact (known servers); when its session is lost and it re-handshakes with
    the rogue in sight, the rogue's identity is not the one trusted for the deployment."""
    policy = FixedComputePolicy(**sim_policy_spec(chunk_size=20))
    async with (
        running_server(make_manifest(port, extra=SERVING), policy) as (server, ready),
        PolicyClient.connect(peer_settings(port), "mallory") as mallory,
        edge_rig(port, tmp_path) as rig,
    ):  # no pins: trust on first use
        await eventually(lambda: rig.engine.chunks_received >= 3, 15, "streaming from the real server")
        rogue = hostile_rogue(mallory.zsession, rogue_keys(ready.keys, replica))
        with closing(rogue):
            attack_started = time.monotonic_ns()
            for _ in range(3):  # the server drops the session: the edge re-handshakes, the rogue in sight
                (session,) = await server.wait_sessions(lambda sessions: len(sessions) == 1)
                server.state.collect(session, "idle")
                await server.wait_sessions(
                    lambda sessions, gone=session.session_id: [s.session_id for s in sessions] not in ([], [gone])
                )
                received = rig.engine.chunks_received
                await eventually(lambda n=received: rig.engine.chunks_received >= n + 2, 15, "streaming again")
            attack_ended = time.monotonic_ns()
    assert rig.summary.final_state == "streaming"
    assert rig.summary.rogue_servers >= 1  # seen, refused, counted
    assert not any(np.isclose(m.chunk_robot, HOSTILE).any() for m in rig.merges.merges)
    assert rig.merges.longest_gap_s(attack_started, attack_ended) < REQUEST_TIMEOUT_S
    executed = [f for f in rig.recording().frames if f.action is not None]
    assert not any(np.isclose(np.frombuffer(f.action.data, "<f4"), HOSTILE).any() for f in executed if f.action)


async def test_known_servers_others_may_write_are_refused(port: int) -> None:
    """Found re-verifying issue 18: another local user who may write the known-servers file
    (mode 0666) adds a rogue's identity next to the real one, and the edge followed the rogue
    (load 0, sorted first). Such a file is now refused, as ssh refuses a key others may read."""
    policy = FixedComputePolicy(**sim_policy_spec(chunk_size=20))
    async with (
        running_server(make_manifest(port, extra=SERVING), policy) as (_, ready),
        PolicyClient.connect(peer_settings(port), "mallory") as mallory,
    ):
        rogue = hostile_rogue(mallory.zsession, rogue_keys(ready.keys))
        with closing(rogue):
            known = KnownServers()
            known.replace(deployment(None, None), [parse_fingerprint(ready.fingerprint), rogue.identity.public_key])
            known.path.chmod(0o666)
            sim = small_sim()
            engine = RemoteEngine(edge_config(port, connect_timeout_s=1.0), sim.spec())
            merges = MergeLog.attach(engine)
            async with running_edge(sim, engine) as run:
                with pytest.raises(BaseException) as info:
                    await run.stop()
    assert "writable by others" in str(first_error(info.value))
    assert rogue.opens == 0
    assert not any(np.isclose(m.chunk_robot, HOSTILE).any() for m in merges.merges)
