"""Nobody closes, resets, feeds, steals or squats another robot's session, whatever it sniffed.

Issue 8, on a flat network: session ids were sequential (closing worked at the first guess),
re-opening under the victim's client id cut its fresh actions for ~10 s, and injected
observations stalled it ~4.5 s. Now every observation and control request must be sealed with
the session key (which never crosses the wire), seq ids only move forward, and a second open
under a live robot's name is refused.
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import numpy as np
import pytest
import zenoh

from servo._core import MSG_CONTROL, MSG_OBS, SCHEMA_VERSION, Header, KeyPair, SessionKey, unauthenticated
from servo.client import PolicyClient, RemoteSession, SessionRejected
from servo.identity import Identity
from servo.transport import query
from servo.wire import (
    CloseRequest,
    Observation,
    Rejection,
    SessionOpen,
    decode,
    encode,
    encode_image,
    encode_tensor,
    resume_body,
)
from tests.security.peers import Capture, Tap, closing, peer_settings
from tests.server.helpers import metric, observation, open_on, signed
from tests.server.policies import FixedComputePolicy
from tests.support import eventually, keep_sending, make_manifest, running_server

pytestmark = pytest.mark.anyio

VICTIM_STATE = 42.0
ATTACKER_STATE = 99.0


#: One lock per streaming session: held by each request in flight.
between_requests: defaultdict[RemoteSession, anyio.Lock] = defaultdict(anyio.Lock)


@asynccontextmanager
async def streaming(session: RemoteSession) -> AsyncIterator[Callable[[], int]]:
    """The victim streams in the background; yields its served-chunk count. Any failure fails the test.

    Its requests hold `between_requests`: the victim's own reset waits for it, as the server
    drops, unanswered, an observation of the episode a reset ends (the request would time out).
    """
    served = 0

    async def loop() -> None:
        nonlocal served
        while True:
            async with between_requests[session]:
                result = await session.infer(*observation(VICTIM_STATE), timeout=5)
            assert result.chunk_robot[0][0] == VICTIM_STATE
            served += 1

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(loop)
            yield lambda: served
            tg.cancel_scope.cancel()
    finally:
        between_requests.pop(session, None)


async def still_streaming(served: Callable[[], int]) -> None:
    before = served()
    await eventually(lambda: served() >= before + 3)


def attacker_body() -> bytes:
    frame = np.zeros((24, 32, 3), np.uint8)
    state = encode_tensor(np.full(6, ATTACKER_STATE, np.float32))
    return encode(Observation(state=state, images={"front": encode_image(frame, 0)}))


def header(msg_type: int, session_id: bytes, seq: int, epoch: int = 0) -> Header:
    return Header(SCHEMA_VERSION, msg_type, 0, seq, 0, epoch, 0, session_id)


async def refused(z: zenoh.Session, key: str, payload: bytes, attachment: bytes | None) -> str:
    (reply,) = await query(z, key, payload=payload, attachment=attachment, timeout=2)
    assert reply.err is not None, "the attack was answered as if it worked"
    return decode(reply.err.payload.to_bytes(), Rejection).code


async def test_a_peer_cannot_close_reset_or_feed_a_session_it_guessed_or_sniffed(port: int) -> None:
    policy = FixedComputePolicy(compute_ms=2)
    async with (
        running_server(make_manifest(port), policy) as (server, ready),
        PolicyClient.connect(peer_settings(port), "robot-7", jpeg_quality=0) as victim,
        PolicyClient.connect(peer_settings(port), "mallory") as mallory,
    ):
        z = mallory.zsession
        keys = ready.keys.client("robot-7")
        sniffer, capture = Tap(z, keys.obs), Capture(z, keys.control)
        with closing(sniffer, capture):
            session = await open_on(victim, ready)
            async with streaming(session) as served:
                await still_streaming(served)
                sniffed = sniffer.wait_for(lambda s: s.header is not None)
                assert sniffed.header is not None
                assert sniffed.attachment is not None
                sid = sniffed.header.session_id
                assert sid == session.wire_id  # what a sniffer learns: the id, never the key
                async with between_requests[session]:
                    await session.reset(1)  # the victim's own reset, encrypted; mallory captures it
                assert capture.arrived.wait(5)
                (reset_body, reset_attachment) = capture.queries[0]
                guessed_key = SessionKey(secrets.token_bytes(32), role="client")
                close = encode(CloseRequest(sid))
                guessed_id = guessed_key.encrypt(header(MSG_CONTROL, secrets.token_bytes(16), 9), close)
                guessed = guessed_key.encrypt(header(MSG_CONTROL, sid, 10), close)
                control_attacks = {
                    "guessed session id": (guessed_id[1], guessed_id[0]),
                    "sniffed id, no attachment": (close, None),
                    "sniffed id, keyless": (close, unauthenticated(header(MSG_CONTROL, sid, 9))),
                    "sniffed id, guessed key": (guessed[1], guessed[0]),
                    "sniffed observation as control": (close, sniffed.attachment),
                    "the victim's reset, replayed": (reset_body, reset_attachment),
                    "the victim's reset, re-bodied as a close": (close, reset_attachment),
                }
                for name, (payload, attachment) in control_attacks.items():
                    code = "unknown_session" if name == "guessed session id" else "unauthenticated"
                    assert await refused(z, keys.control, payload, attachment) == code, name
                feed = attacker_body()

                def guess() -> None:
                    for seq in range(1000, 1050):
                        attachment, ciphertext = guessed_key.encrypt(header(MSG_OBS, sid, seq, session.epoch), feed)
                        z.put(keys.obs, ciphertext, attachment=attachment)

                def rejected(reason: str, n: int = 1) -> Callable[[], bool]:
                    return lambda: metric(server, "servo_observations_rejected_total", reason=reason) >= n

                # The attacker keeps trying until the server has refused each attempt (its puts may
                # be dropped by its own congestion control at load).
                await keep_sending(guess, rejected("mac", 50), what="50 guesses refused")
                await keep_sending(  # a genuine one, replayed
                    lambda: z.put(keys.obs, sniffed.payload, attachment=sniffed.attachment), rejected("replay")
                )
                await keep_sending(
                    lambda: z.put(
                        keys.obs, feed, attachment=unauthenticated(header(MSG_OBS, secrets.token_bytes(16), 5))
                    ),
                    rejected("session"),
                )
                await still_streaming(served)
            (kept,) = server.registry.snapshot()
            assert (kept.session_id, kept.client_id, kept.episode_id) == (session.session_id, "robot-7", 1)
            await session.close()
    assert ATTACKER_STATE not in policy.served
    assert metric(server, "servo_sessions_collected_total", reason="closed") == 1  # the victim's own close
    for reason, count in {"session": 1, "header": 2, "mac": 3, "replay": 1}.items():
        assert metric(server, "servo_control_rejected_total", reason=reason) == count, reason
    assert victim.statistics().chunks_rejected["mac"] >= 1  # the keyless hint for the guessed id: ignored


async def test_a_peer_cannot_squat_or_steal_a_live_robots_name(port: int) -> None:
    """Opening under robot-7's id while robot-7 streams is refused, with or without a forged resume
    proof, and robot-7's own open, captured and replayed, is refused as a replay; robot-7 never
    notices. (The squatter is another robot: its own identity.)"""
    policy = FixedComputePolicy(compute_ms=2)
    async with (
        running_server(make_manifest(port), policy) as (server, ready),
        PolicyClient.connect(peer_settings(port), "robot-7", jpeg_quality=0) as victim,
        PolicyClient.connect(peer_settings(port), "robot-7", identity=Identity.generate()) as squatter,
    ):
        capture = Capture(squatter.zsession, ready.keys.client("robot-7").session)
        with closing(capture):
            first = await open_on(victim, ready)
            # The victim reconnects, proving it held its first session; mallory captures that open.
            session = await open_on(victim, ready, epoch=1, previous=first)
            await first.close()
            assert capture.arrived.wait(5)
            captured_open = capture.queries[-1][0]
            async with streaming(session) as served:
                await still_streaming(served)
                (status,) = await squatter.discover()
                with pytest.raises(SessionRejected) as info:
                    await squatter.open_session(status, features=ready.info.features, fps=ready.info.fps)
                assert info.value.rejection.code == "session_exists"
                key = ready.keys.client("robot-7").session
                client_key = KeyPair().public_key
                proof = SessionKey(secrets.token_bytes(32), role="client").authenticate(
                    header(MSG_CONTROL, session.wire_id, 1_000, session.epoch), resume_body(client_key)
                )
                forged = SessionOpen(
                    "robot-7", [SCHEMA_VERSION], ready.info.features, ready.info.fps, client_key, resume=proof
                )
                assert await refused(squatter.zsession, key, encode(forged), None) == "unauthenticated"  # unsigned
                forged = await signed(squatter, ready, forged)
                assert await refused(squatter.zsession, key, encode(forged), None) == "session_exists"
                # robot-7's own signed open, captured and replayed: its X25519 key was used already.
                assert await refused(squatter.zsession, key, captured_open, None) == "unauthenticated"
                await still_streaming(served)
            (kept,) = server.registry.snapshot()
            assert kept.session_id == session.session_id
            await session.close()
    assert metric(server, "servo_sessions_rejected_total", code="session_exists") == 2
    assert metric(server, "servo_sessions_rejected_total", code="unauthenticated") == 2
    assert metric(server, "servo_sessions_collected_total", reason="replaced") == 1  # the victim's own resume
