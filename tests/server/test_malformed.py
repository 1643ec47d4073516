"""Bad input costs one error reply for the sender, never the server or the other sessions."""

from __future__ import annotations

import contextlib
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

from servo._core import MSG_CHUNK, MSG_ERROR, SessionKey, unauthenticated
from servo.client import RemoteSession, ServerError
from servo.server.service import PolicyServer
from servo.transport import query
from servo.wire import (
    ActionChunk,
    EncodedImage,
    ErrorEvent,
    Observation,
    Rejection,
    ResetRequest,
    decode,
    encode,
    encode_tensor,
)
from tests.server.helpers import (
    ActionTap,
    action_tap,
    connected,
    metric,
    obs_header,
    observation,
    observation_tap,
    open_on,
    sealed,
)
from tests.server.policies import CHUNK, FailingPolicy, FixedComputePolicy
from tests.support import eventually, make_manifest, running_server

#: The QoS of servo's own observation publisher: what a peer sends here must arrive (not be dropped at load).
BLOCK = zenoh.CongestionControl.BLOCK

pytestmark = pytest.mark.anyio

LIMIT = 200_000
SERVING = f"[serving]\nmax_observation_bytes = {LIMIT}\n"
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


GOOD_JPEG = simplejpeg.encode_jpeg(np.full((24, 32, 3), 128, np.uint8), quality=90, colorspace="RGB")

#: Authenticated observations (encrypted by the session's own key) whose body is unusable: the
#: server answers each with an error for that request.
ANSWERED: dict[str, Callable[[], bytes]] = {
    "garbage body": lambda: b"\x00\xffnot msgpack at all",
    "msgpack of the wrong shape": lambda: encode(ErrorEvent("x", "y")),
    "empty body": lambda: b"",
    "invalid UTF-8 in the task": lambda: body().replace(b"\xa4task\xa0", b"\xa4task\xa2\xff\xfe"),
    "wrong state dim": lambda: body(np.zeros(5, np.float32)),
    "wrong state dtype": lambda: body(np.zeros(6, np.float64)),
    "NaN state": lambda: body(np.array([0, np.nan, 0, 0, 0, 0], np.float32)),
    "inf state": lambda: body(np.array([np.inf, 0, 0, 0, 0, 0], np.float32)),
    "corrupt JPEG": lambda: body(images=jpeg(b"\xff\xd8\xff\xe0garbage")),
    "truncated JPEG": lambda: body(images=jpeg(GOOD_JPEG[:40])),
    "JPEG size lies": lambda: body(images=jpeg(GOOD_JPEG, 48, 64)),
    "missing camera": lambda: body(images={}),
    "raw frame too short": lambda: body(images={"front": EncodedImage("raw", 24, 32, memoryview(b"\x00" * 10))}),
    "absurd image size": lambda: body(images={"front": EncodedImage("raw", 1 << 20, 1 << 20, memoryview(b""))}),
}


#: ``(attachment, payload)`` as put on the observation key.
Message = tuple[bytes | None, bytes]


@dataclass(frozen=True)
class Dropped:
    """An observation that must never reach a mailbox: dropped, counted by ``reason``, unanswered.

    ``message`` makes it from the session, a seq_id, a plaintext body and an observation the
    session sent earlier (as sent, for the replay).
    """

    payload: Callable[[], bytes]
    message: Callable[[RemoteSession, int, bytes, Message], Message]
    reason: str


def forged(session: RemoteSession, seq: int, payload: bytes, sent: Message) -> Message:
    return SessionKey(bytes(32), role="client").encrypt(obs_header(session, seq), payload)


def bad_magic(session: RemoteSession, seq: int, payload: bytes, sent: Message) -> Message:
    attachment, ciphertext = sealed(session, seq, payload)
    return b"XX" + attachment[2:], ciphertext


def swapped(session: RemoteSession, seq: int, payload: bytes, sent: Message) -> Message:
    attachment, ciphertext = sealed(session, seq, payload)
    return attachment, bytes([ciphertext[0] ^ 1]) + ciphertext[1:]


DROPPED = {
    "missing attachment": Dropped(body, lambda s, q, p, sent: (None, p), "header"),
    "short attachment": Dropped(body, lambda s, q, p, sent: (b"SV\x01\x00", p), "header"),
    "bad magic": Dropped(body, bad_magic, "header"),
    "wrong schema version": Dropped(body, lambda s, q, p, sent: (version7_header(q), p), "header"),
    "wrong msg_type": Dropped(
        body, lambda s, q, p, sent: (unauthenticated(obs_header(s, q, msg_type=MSG_CHUNK)), p), "header"
    ),
    "unauthenticated": Dropped(body, lambda s, q, p, sent: (unauthenticated(obs_header(s, q)), p), "mac"),
    "forged tag": Dropped(body, forged, "mac"),
    "ciphertext changed": Dropped(body, swapped, "mac"),
    "another session id": Dropped(body, lambda s, q, p, sent: sealed(s, q, p, session_id=bytes(16)), "session"),
    "another epoch": Dropped(body, lambda s, q, p, sent: sealed(s, q, p, session_epoch=s.epoch + 1), "epoch"),
    "replayed seq": Dropped(body, lambda s, q, p, sent: sent, "replay"),
    "oversized body": Dropped(lambda: b"\x00" * (LIMIT + 1), lambda s, q, p, sent: sealed(s, q, p), "too_large"),
}
DROPPED_SEQ = {name: seq for seq, name in enumerate(DROPPED, start=100)}


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


async def test_malformed_observations_are_answered_and_do_not_disturb_others(port: int) -> None:
    manifest = make_manifest(port, extra=SERVING)
    async with (
        running_server(manifest, policy=FixedComputePolicy(compute_ms=2)) as (server, ready),
        connected(port, "victim") as victim,
        connected(port, "bystander") as bystander,
    ):
        session = await open_on(victim, ready)
        other = await open_on(bystander, ready)
        async with (
            action_tap(victim.zsession, session.keys.action, session.key) as tap,
            well_behaved(other) as served,
        ):
            await still_served(served)
            for seq, (name, make) in enumerate(ANSWERED.items(), start=100):
                attachment, ciphertext = sealed(session, seq, make())
                victim.zsession.put(session.keys.obs, ciphertext, attachment=attachment, congestion_control=BLOCK)
                event = await expect_error(tap, seq)
                assert event.code == "bad_observation", (name, event)
                assert event.message, name
                await still_served(served)
            # after all that, the victim's own session still works
            attachment, ciphertext = sealed(session, seq + 1, body(np.full(6, 7, np.float32)))
            victim.zsession.put(session.keys.obs, ciphertext, attachment=attachment, congestion_control=BLOCK)
            header, chunk = await tap.next(lambda h: h is not None and h.seq_id == seq + 1)
            assert header is not None
            assert header.msg_type == MSG_CHUNK
            assert decode(chunk, ActionChunk).chunk_robot.shape == (CHUNK, 6)
        await session.close()
        await other.close()
    assert metric(server, "servo_requests_total", outcome="bad_observation") == len(ANSWERED)
    assert metric(server, "servo_requests_total", outcome="ok") >= 2 * len(ANSWERED)


async def test_unauthenticated_observations_are_dropped_unanswered(port: int) -> None:
    """Nothing that fails authentication is served or answered; each is counted by reason."""
    manifest = make_manifest(port, extra=SERVING)
    async with (
        running_server(manifest, policy=FixedComputePolicy(compute_ms=2)) as (server, ready),
        connected(port, "victim") as victim,
        connected(port, "bystander") as bystander,
    ):
        session = await open_on(victim, ready)
        other = await open_on(bystander, ready)
        async with observation_tap(bystander.zsession, session.keys.obs) as sent:
            # The tap's subscription reaches the victim's session, and each sample the loop, when
            # the scheduler lets them: at load the first observations can pass before either. The
            # victim infers until one is tapped ("replayed seq" sends the first tapped again).
            accepted = 0
            with anyio.fail_after(60):
                while not sent:
                    accepted += 1
                    await session.infer(*observation(1), timeout=5)
                    with contextlib.suppress(AssertionError):  # not tapped: the victim infers again
                        await eventually(lambda: bool(sent), 1, "the tap to catch the observation")
        first = sent[0]
        auth = server.registry.by_client("victim").auth  # type: ignore[union-attr]
        async with (
            action_tap(victim.zsession, session.keys.action, session.key) as tap,
            well_behaved(other) as served,
        ):
            await still_served(served)
            expected: Counter[str] = Counter()
            for seq, case in enumerate(DROPPED.values(), start=100):
                attachment, payload = case.message(session, seq, case.payload(), first)
                victim.zsession.put(session.keys.obs, payload, attachment=attachment, congestion_control=BLOCK)
                expected[case.reason] += 1
                count = expected[case.reason]
                await eventually(
                    lambda r=case.reason, n=count: metric(server, "servo_observations_rejected_total", reason=r) >= n
                )
                await still_served(served)
            assert auth.last_obs_seq == accepted  # no drop moved the replay window
            result = await session.infer(*observation(7), timeout=5)
            assert result.chunk_robot[0][0] == 7
            await tap.next(lambda h: h is not None and h.msg_type == MSG_CHUNK)
            # Nothing dropped was answered: the chunk, and the keyless unknown-session hint for
            # the observation naming another session (the client ignores it: not its id).
            answered = [(h.msg_type, h.seq_id, h.session_id) for h, _ in tap.seen if h is not None]
            hint_for = DROPPED_SEQ["another session id"]
            assert answered == [(MSG_ERROR, hint_for, bytes(16)), (MSG_CHUNK, result.seq_id, session.wire_id)]
        await session.close()
        await other.close()
    for reason, count in Counter(c.reason for c in DROPPED.values()).items():
        assert metric(server, "servo_observations_rejected_total", reason=reason) == count, reason
    assert metric(server, "servo_requests_total", outcome="ok") >= 2


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
        header, ciphertext = sealed(session, 1, body())
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
                z.put(key, ciphertext, attachment=header, congestion_control=BLOCK)
                delivered_possible += 1
            except zenoh.ZError:
                pass  # zenoh itself refused the key: fine
        for selector in (f"{prefix}/c/*/control", f"{prefix}/c/**"):
            replies = await query(z, selector, payload=encode(ResetRequest(session.wire_id, 3)), timeout=2)
            for reply in replies:
                assert reply.err is not None
                code = decode(reply.err.payload.to_bytes(), Rejection).code
                assert code in ("bad_request", "unknown_session", "unauthenticated")
        await eventually(lambda: metric(server, "servo_observations_rejected_total", reason="key") >= 1)
        # nothing was served into the robot's session, and it still works
        result = await session.infer(*observation(5), timeout=5)
        assert (result.seq_id, result.chunk_robot[0][0]) == (2, 5)
        # the reply thread counts an answer after its put: the chunk may arrive first
        await eventually(lambda: _served(server) >= 1, what="the answer counted")
        assert _served(server) == 1
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
        key = ready.keys.client("ghost").obs
        async with action_tap(client.zsession, ready.keys.client("ghost").action) as tap:
            attachment, ciphertext = sealed(session, 1, body())
            client.zsession.put(key, ciphertext, attachment=attachment, congestion_control=BLOCK)
            await eventually(lambda: metric(server, "servo_observations_rejected_total", reason="session") >= 1)
            # the keyless hint, so a client whose server restarted re-opens at once
            header, notice = await tap.next(lambda h: h is not None and h.msg_type == MSG_ERROR)
            assert header is not None
            assert header.session_id == session.wire_id
            assert decode(notice, ErrorEvent).code == "unknown_session"
        assert metric(server, "servo_unknown_session_notices_total") == 1
        assert _served(server) == 0
        await session.close()


def _served(server: PolicyServer) -> float:
    return metric(server, "servo_requests_total", outcome="ok")
