"""Bad input costs one error reply for the sender, never the server or the other sessions."""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import numpy as np
import pytest
import simplejpeg
import zenoh

from servo._core import MSG_CHUNK, MSG_ERROR
from servo.client import RemoteSession, ServerError
from servo.server.service import PolicyServer
from servo.transport import query
from servo.wire import EncodedImage, ErrorEvent, Observation, Rejection, ResetRequest, decode, encode, encode_tensor
from tests.server.helpers import (
    ActionTap,
    action_tap,
    connected,
    eventually,
    metric,
    obs_header,
    observation,
    open_on,
)
from tests.server.policies import FailingPolicy, FixedComputePolicy
from tests.support import make_manifest, running_server

pytestmark = pytest.mark.anyio

LIMIT = 200_000
FRAME = np.zeros((24, 32, 3), np.uint8)


def body(
    state: np.ndarray | None = None,
    images: dict[str, EncodedImage] | None = None,
) -> bytes:
    state = np.zeros(6, np.float32) if state is None else state
    if images is None:
        images = {"front": EncodedImage("raw", 24, 32, memoryview(FRAME.tobytes()))}
    return encode(Observation(state=encode_tensor(state), images=images))


def jpeg(data: bytes, h: int = 24, w: int = 32) -> dict[str, EncodedImage]:
    return {"front": EncodedImage("jpeg", h, w, memoryview(data))}


def version7_header(seq: int) -> bytes:
    # b"SV" | schema_version u16 | msg_type u8 | flags u8 | seq u64 | episode u32 | epoch u32 | mono i64
    # | session_id (16) | tag (16)
    return struct.pack("<2sHBBQIIq16s16s", b"SV", 7, 1, 0, seq, 0, 0, 0, bytes(16), bytes(16))


@dataclass(frozen=True)
class Bad:
    payload: Callable[[], bytes]
    attachment: Callable[[RemoteSession, int], bytes | None]
    code: str
    routed_seq: bool  # the error echoes our seq (False: the header was unreadable, seq 0)


def good_header(session: RemoteSession, seq: int) -> bytes:
    return obs_header(session, seq)


GOOD_JPEG = simplejpeg.encode_jpeg(np.full((24, 32, 3), 128, np.uint8), quality=90, colorspace="RGB")

CASES = {
    "garbage body": Bad(lambda: b"\x00\xffnot msgpack at all", good_header, "bad_observation", True),
    "msgpack of the wrong shape": Bad(lambda: encode(ErrorEvent("x", "y")), good_header, "bad_observation", True),
    "empty body": Bad(lambda: b"", good_header, "bad_observation", True),
    "missing attachment": Bad(lambda: body(), lambda s, q: None, "bad_header", False),
    "short attachment": Bad(lambda: body(), lambda s, q: b"SV\x01\x00", "bad_header", False),
    "bad magic": Bad(lambda: body(), lambda s, q: b"XX" + obs_header(s, q)[2:], "bad_header", False),
    "wrong schema version": Bad(lambda: body(), lambda s, q: version7_header(q), "bad_header", False),
    "wrong msg_type": Bad(lambda: body(), lambda s, q: obs_header(s, q, msg_type=MSG_CHUNK), "bad_header", True),
    "oversized body": Bad(lambda: b"\x00" * (LIMIT + 1), good_header, "too_large", True),
    "wrong state dim": Bad(lambda: body(np.zeros(5, np.float32)), good_header, "bad_observation", True),
    "wrong state dtype": Bad(lambda: body(np.zeros(6, np.float64)), good_header, "bad_observation", True),
    "NaN state": Bad(lambda: body(np.array([0, np.nan, 0, 0, 0, 0], np.float32)), good_header, "bad_observation", True),
    "inf state": Bad(lambda: body(np.array([np.inf, 0, 0, 0, 0, 0], np.float32)), good_header, "bad_observation", True),
    "corrupt JPEG": Bad(lambda: body(images=jpeg(b"\xff\xd8\xff\xe0garbage")), good_header, "bad_observation", True),
    "truncated JPEG": Bad(lambda: body(images=jpeg(GOOD_JPEG[:40])), good_header, "bad_observation", True),
    "JPEG size lies": Bad(lambda: body(images=jpeg(GOOD_JPEG, 48, 64)), good_header, "bad_observation", True),
    "missing camera": Bad(lambda: body(images={}), good_header, "bad_observation", True),
    "raw frame too short": Bad(
        lambda: body(images={"front": EncodedImage("raw", 24, 32, memoryview(b"\x00" * 10))}),
        good_header,
        "bad_observation",
        True,
    ),
    "absurd image size": Bad(
        lambda: body(images={"front": EncodedImage("raw", 1 << 20, 1 << 20, memoryview(b""))}),
        good_header,
        "bad_observation",
        True,
    ),
}


@asynccontextmanager
async def well_behaved(session: RemoteSession) -> AsyncIterator[Callable[[], int]]:
    """A client that keeps inferring in the background; yields a function counting its chunks."""
    served = 0
    failures: list[BaseException] = []

    async def loop() -> None:
        nonlocal served
        while True:
            try:
                result = await session.infer(*observation(42), timeout=5)
            except BaseException as exc:  # recorded: the test fails on any
                failures.append(exc)
                raise
            assert result.chunk_robot[0][0] == 42
            served += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(loop)
        yield lambda: served
        tg.cancel_scope.cancel()
    assert not [f for f in failures if not isinstance(f, anyio.get_cancelled_exc_class())]


async def still_served(count: Callable[[], int]) -> None:
    before = count()
    await eventually(lambda: count() >= before + 2)


async def expect_error(tap: ActionTap, seq: int) -> ErrorEvent:
    header, payload = await tap.next(lambda h: h is not None and h.msg_type == MSG_ERROR and h.seq_id == seq)
    assert header is not None
    return decode(payload, ErrorEvent)


def manifest_for(port: int) -> str:
    return f"[serving]\nmax_observation_bytes = {LIMIT}\n"


async def test_malformed_observations_are_answered_and_do_not_disturb_others(port: int) -> None:
    manifest = make_manifest(port, extra=manifest_for(port))
    async with (
        running_server(manifest, policy=FixedComputePolicy(compute_ms=2)) as (server, ready),
        connected(port, "victim") as victim,
        connected(port, "bystander") as bystander,
    ):
        session = await open_on(victim, ready)
        other = await open_on(bystander, ready)
        async with action_tap(victim.zsession, session.keys.action) as tap, well_behaved(other) as served:
            await still_served(served)
            for seq, (name, case) in enumerate(CASES.items(), start=100):
                attachment = case.attachment(session, seq)
                victim.zsession.put(session.keys.obs, case.payload(), attachment=attachment)
                event = await expect_error(tap, seq if case.routed_seq else 0)
                assert event.code == case.code, (name, event)
                assert event.message, name
                await still_served(served)
            # after all that, the victim's own session still works
            result = await session.infer(*observation(7), timeout=5)
            assert result.chunk_robot[0][0] == 7
        await session.close()
        await other.close()
    expected = Counter(case.code for case in CASES.values())
    for code, count in expected.items():
        assert metric(server, "servo_requests_total", outcome=code) == count, code
    assert metric(server, "servo_requests_total", outcome="ok") >= 2 * len(CASES)


async def test_client_api_surfaces_server_errors(port: int) -> None:
    """Through PolicyClient: the refused request raises ServerError; the next one is served."""
    async with (
        running_server(make_manifest(port), policy=FailingPolicy()) as (server, ready),
        connected(port, "robot") as client,
    ):
        session = await open_on(client, ready)
        with pytest.raises(ServerError) as info:
            await session.infer(*observation(1.0, dim=5), timeout=5)
        assert info.value.code == "bad_observation"
        assert "observation.state" in info.value.message
        with pytest.raises(ServerError) as info:
            await session.infer(*observation(np.array([1, np.nan, 0, 0, 0, 0])), timeout=5)
        assert info.value.code == "bad_observation"
        assert "NaN" in info.value.message
        with pytest.raises(ServerError) as info:
            await session.infer(*observation(-1.0), timeout=5)  # the policy raises on this one
        assert info.value.code == "inference_failed"
        assert "policy bug" in info.value.message
        result = await session.infer(*observation(3.0), timeout=5)
        assert result.chunk_robot[0][0] == 3
        await session.close()
    assert metric(server, "servo_requests_total", outcome="inference_failed") == 1


async def test_hostile_keys_crash_nothing(port: int) -> None:
    async with (
        running_server(make_manifest(port), policy=FixedComputePolicy()) as (server, ready),
        connected(port, "robot") as client,
        connected(port, "intruder") as intruder,
    ):
        session = await open_on(client, ready)
        prefix = ready.keys.prefix
        z = intruder.zsession
        header = obs_header(session, 1)
        hostile = [
            f"{prefix}/c/*/obs",
            f"{prefix}/c/**/obs",
            f"{prefix}/c/robot/extra/obs",
            f"{prefix}/c/robot/obs/extra",
            f"{prefix}/c/$*/obs",
            f"{prefix}/*/*/obs",
            f"{prefix}/**",
        ]
        delivered_possible = 0
        for key in hostile:
            try:
                z.put(key, body(), attachment=header)
                delivered_possible += 1
            except zenoh.ZError:
                pass  # zenoh itself refused the key: fine
        for selector in (f"{prefix}/c/*/control", f"{prefix}/c/**"):
            replies = await query(z, selector, payload=encode(ResetRequest(session.session_id, 3)), timeout=2)
            for reply in replies:
                assert reply.err is not None
                assert decode(reply.err.payload.to_bytes(), Rejection).code in ("bad_request", "unknown_session")
        await eventually(lambda: metric(server, "servo_dropped_observations_total", reason="bad_key") >= 1)
        # nothing was served into the robot's session, and it still works
        result = await session.infer(*observation(5), timeout=5)
        assert (result.seq_id, result.chunk_robot[0][0]) == (1, 5)
        assert session.episode_id == 0
        assert len(server.registry) == 1
        await session.close()
    assert delivered_possible >= 1


async def test_observations_without_a_session_are_dropped(port: int) -> None:
    async with (
        running_server(make_manifest(port), policy=FixedComputePolicy()) as (server, ready),
        connected(port, "robot") as client,
    ):
        session = await open_on(client, ready)
        await session.close()
        key = ready.keys.client("ghost").obs
        client.zsession.put(key, body(), attachment=obs_header(session, 1))
        await eventually(lambda: metric(server, "servo_dropped_observations_total", reason="no_session") >= 1)
        assert _served(server) == 0


def _served(server: PolicyServer) -> float:
    return metric(server, "servo_requests_total", outcome="ok")
