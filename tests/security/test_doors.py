"""Every signed door bounded before it signs, and closed to a revoked robot at once.

Review of issue 29: the trajectory door signed a refusal for every stranger before any budget
was spent, and the status signed every query with no budget at all, so a stranger on the
network made a replica sign as fast as it could ask; the budgets that existed were per key, so
an attacker minting a key per request had a fresh burst each time. And the audit door admitted
a robot because rows of its key existed, so a revoked robot still read its audit trail.

Each flood here keeps sending until the door goes silent (a query dropped unanswered), then
counts what was signed: at most the door's burst plus its rate over the flood, whatever the
number of keys.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import msgspec
import pytest
import zenoh

from servo._core import SIGNATURE_SIZE
from servo.cli.console import Console
from servo.cli.robots import main as robots_cli
from servo.client import NoServerFound, PolicyClient, ServerError, SessionRejected
from servo.client.audit import ask_audit
from servo.identity import Identity
from servo.server.service import PolicyServer, ServerReady
from servo.transport import query
from servo.wire import (
    NONCE_SIZE,
    SUPPORTED_SCHEMA_VERSIONS,
    AuditQuery,
    Rejection,
    SessionOpen,
    StatusReply,
    TrajectoryRequest,
    decode,
    encode,
    fingerprint,
)
from tests.security.lan import lan_client, lan_server
from tests.security.peers import peer_settings
from tests.security.test_trajectories import wave_library
from tests.server.helpers import metric, observation, open_on
from tests.support import eventually, free_port, make_manifest, running_server

pytestmark = pytest.mark.anyio

BURST, RATE = 20, 2.0
LIMITS = (
    f"[limits]\nstatus_query_burst = {BURST}\nstatus_queries_per_s = {RATE}\n"
    f"door_request_burst = {BURST}\ndoor_requests_per_s = {RATE}\n"
    "requester_request_burst = 5\nrequester_requests_per_s = 1.0\n"
)
#: A forged signature (the door must verify it to know).
FORGED = os.urandom(SIGNATURE_SIZE)
ENROLLED = Identity.generate()
#: A closed door on loopback: the manifest enrols a robot (not the attacker).
CLOSED = f'[security]\nrobots = [{{name = "robot-7", identity = "{fingerprint(ENROLLED.public_key)}"}}]\n'
#: Queries in flight at once.
PARALLEL = 16
#: However slow the machine, a flood ends (the door goes silent long before).
FLOOD_TIMEOUT_S = 60.0

#: What a query met: its one reply (a refusal, or an answer), or nothing (the door's silence).
Judge = Callable[[zenoh.Reply], str]


@asynccontextmanager
async def stranger_at(port: int, extra: str) -> AsyncIterator[tuple[PolicyServer, ServerReady, PolicyClient]]:
    """A server with ``extra`` manifest lines, and a stranger joined to it (its own identity)."""
    async with (
        running_server(make_manifest(port, extra=extra)) as (server, ready),
        PolicyClient.connect(peer_settings(port), "mallory") as mallory,
    ):
        yield server, ready, mallory


async def flood(
    mallory: PolicyClient, key: str, payload: Callable[[], bytes], judge: Judge
) -> tuple[dict[str, int], float]:
    """Query ``key`` ``PARALLEL`` at a time until one is met with silence; what came back, and how long.

    ``payload`` makes each query (a new key every time); ``judge`` says what its reply was:
    ``signed`` or ``unsigned``.
    """
    seen = {"signed": 0, "unsigned": 0, "silence": 0}
    started = time.monotonic()

    async def one() -> None:
        replies = await query(mallory.zsession, key, payload=payload(), timeout=10)
        seen[judge(replies[0]) if replies else "silence"] += 1

    with anyio.fail_after(FLOOD_TIMEOUT_S):
        while not seen["silence"]:
            async with anyio.create_task_group() as tg:
                for _ in range(PARALLEL):
                    tg.start_soon(one)
    return seen, time.monotonic() - started


def bound(elapsed_s: float) -> float:
    """The most a door may sign in ``elapsed_s`` (its burst, its rate, the first second's refill)."""
    return BURST + RATE * (elapsed_s + 1.0)


def refusal(reply: zenoh.Reply) -> Rejection:
    assert reply.err is not None
    return decode(reply.err.payload.to_bytes(), Rejection)


def signed_refusal(reply: zenoh.Reply) -> str:
    refused = refusal(reply)
    assert refused.code == "unauthenticated"
    return "signed" if refused.signature else "unsigned"


async def test_a_key_minting_stranger_makes_the_trajectory_door_sign_at_most_its_budget(
    port: int, tmp_path: Path
) -> None:
    _, library = wave_library(tmp_path, 10)
    async with stranger_at(port, CLOSED + LIMITS + library) as (server, ready, mallory):

        def fetch() -> bytes:
            robot = os.urandom(32)  # a new robot key every time
            sent = TrajectoryRequest("wave", os.urandom(NONCE_SIZE), os.urandom(32), "mallory", robot, FORGED)
            return encode(sent)

        seen, elapsed = await flood(mallory, ready.keys.trajectory, fetch, signed_refusal)
        signatures = metric(server, "servo_door_signatures_total", door="trajectory")
        dropped = metric(server, "servo_door_dropped_total", door="trajectory", budget="door")
    assert seen["signed"] <= bound(elapsed), seen
    assert signatures <= bound(elapsed)
    assert dropped >= 1


def signed_status(reply: zenoh.Reply) -> str:
    assert reply.ok is not None
    decode(reply.ok.payload.to_bytes(), StatusReply)
    return "signed" if reply.ok.attachment is not None else "unsigned"


async def test_a_stranger_makes_the_status_sign_at_most_its_budget_and_discovery_comes_back(port: int) -> None:
    async with stranger_at(port, LIMITS) as (server, ready, mallory):
        seen, elapsed = await flood(mallory, ready.keys.status, lambda: os.urandom(16), signed_status)
        signatures = metric(server, "servo_door_signatures_total", door="status")
        assert seen["signed"] <= bound(elapsed), seen
        assert signatures <= bound(elapsed)
        assert metric(server, "servo_door_dropped_total", door="status", budget="door") >= 1

        # The bucket refills: an honest robot discovers the replica again.
        async def found() -> bool:
            try:
                return any(s.keys == ready.keys for s in await mallory.discover())
            except NoServerFound:  # still silent: the bucket has not refilled yet
                return False

        with anyio.fail_after(30):
            while not await found():
                pass


async def test_a_key_minting_stranger_is_bounded_by_the_audit_door_too(port: int) -> None:
    async with stranger_at(port, LIMITS) as (server, ready, mallory):

        def ask() -> bytes:
            asker, nonce = os.urandom(32), os.urandom(NONCE_SIZE)  # a new asker every time
            return encode(AuditQuery("robot-7", asker=asker, reply_key=os.urandom(32), nonce=nonce, signature=FORGED))

        def unsigned(reply: zenoh.Reply) -> str:
            return "signed" if refusal(reply).signature else "unsigned"  # refused: nothing of robot-7

        seen, _ = await flood(mallory, ready.keys.audit, ask, unsigned)
        assert seen["unsigned"] >= 1
        assert seen["signed"] == 0
        assert metric(server, "servo_door_dropped_total", door="audit", budget="door") >= 1
        assert metric(server, "servo_door_signatures_total", door="audit") == 0


async def test_a_stranger_makes_an_open_door_verify_at_most_its_budget(port: int) -> None:
    """On an open door (the loopback quick start) every open's signature is checked: forged ones too."""
    async with stranger_at(port, LIMITS) as (server, ready, mallory):
        (info,) = [s for s in await mallory.discover() if s.keys == ready.keys]
        versions, features, fps = list(SUPPORTED_SCHEMA_VERSIONS), ready.info.features, ready.info.fps

        def forged_open() -> bytes:
            robot = os.urandom(32)  # a new robot every time
            sent = SessionOpen("mallory", versions, features, fps, os.urandom(32), robot_key=robot)
            return encode(msgspec.structs.replace(sent, robot_signature=FORGED, nonce=info.status.nonce))

        def verified(reply: zenoh.Reply) -> str:
            assert "does not verify" in refusal(reply).reason
            return "unsigned"

        seen, elapsed = await flood(mallory, ready.keys.client("mallory").session, forged_open, verified)
        assert seen["unsigned"] <= bound(elapsed), seen  # each one an Ed25519 verification
        assert metric(server, "servo_door_dropped_total", door="session", budget="door") >= 1


async def test_a_revoked_robot_reads_no_audit_fetches_no_trajectory_and_opens_nothing(tmp_path: Path) -> None:
    _, library = wave_library(tmp_path, 10)
    port = free_port()
    async with (
        lan_server(port, security=library) as (server, ready),
        lan_client(server, port, tmp_path, "robot-7", join=ready.join_token) as robot,
    ):
        session = await open_on(robot, ready)
        joints = len(ready.info.features.state_names)
        await session.infer(*observation(0.0, {"front": (48, 64)}, dim=joints), timeout=10)
        (info,) = [s for s in await robot.discover() if s.keys == ready.keys]
        own = AuditQuery("robot-7")
        assert (await ask_audit(robot.zsession, ready.keys, info.status, robot.identity, own, timeout=5)).entries
        await robot.fetch_trajectory(info, "wave")

        assert robots_cli(["revoke", "robot-7"], Console(live=False)) == 0
        await eventually(lambda: session.lost.is_set(), 15, "the revoked robot's session closed")
        (info,) = [s for s in await robot.discover() if s.keys == ready.keys]  # the status is everybody's
        with pytest.raises(ServerError) as audit:
            await ask_audit(robot.zsession, ready.keys, info.status, robot.identity, own, timeout=5)
        with pytest.raises(ServerError) as trajectory:
            await robot.fetch_trajectory(info, "wave")
        with pytest.raises(SessionRejected) as reopened:  # its join token is spent
            await open_on(robot, ready)
    assert audit.value.code == "unauthenticated"
    assert "nor a robot it admits" in audit.value.message
    assert trajectory.value.code == "unauthenticated"
    assert "is not enrolled on this server" in trajectory.value.message
    assert reopened.value.rejection.code == "unauthenticated"
