"""The server bounds everything a remote peer controls, against a real server (issue 8, item 5).

A 2 MB observation with two 8192x8192 JPEGs pushed server RSS from 1.1 GB to 5.5 GB and took
2-10 s per request; one peer could take every session slot. Now frames are refused by their
declared and JPEG-header sizes before anything is decoded, sessions declare cameras within a
pixel cap and a per-request decode budget, opens and observations are rate limited, and idle
sessions are evicted. Every attack here runs beside a streaming robot that must not notice.
"""

from __future__ import annotations

import functools
import resource

import numpy as np
import pytest
import simplejpeg
import zenoh

from servo._core import MSG_ERROR
from servo.client import PolicyClient, SessionRejected
from servo.wire import CameraFeature, EncodedImage, ErrorEvent, Features, Observation, decode, encode, encode_tensor
from tests.security.test_sessions import VICTIM_STATE, still_streaming, streaming
from tests.server.helpers import action_tap, metric, open_on, sealed
from tests.server.policies import FixedComputePolicy
from tests.support import client_settings, make_manifest, running_server

pytestmark = pytest.mark.anyio

BOMB = 8192
BOMBER_STATE = 13.0
FRONT = (24, 32)  # the camera `observation()` sends, which FixedComputePolicy reads


def jpeg(frame: np.ndarray) -> EncodedImage:
    data = simplejpeg.encode_jpeg(frame, quality=10, colorspace="RGB", colorsubsampling="420")
    return EncodedImage("jpeg", frame.shape[0], frame.shape[1], memoryview(data))


@functools.cache
def bombs() -> dict[str, bytes]:
    """Observation bodies a key holder sends: every one decodes to far more pixels than declared."""
    big = np.zeros((BOMB, BOMB, 3), np.uint8)
    bomb = jpeg(big)
    del big
    small = jpeg(np.zeros((*FRONT, 3), np.uint8))
    lying = bytearray(small.data)
    sof = lying.index(b"\xff\xc0")
    lying[sof + 5 : sof + 9] = BOMB.to_bytes(2, "big") * 2

    def body(images: dict[str, EncodedImage]) -> bytes:
        return encode(Observation(state=encode_tensor(np.full(6, BOMBER_STATE, np.float32)), images=images))

    return {
        "two 8192x8192 JPEGs, declared": body({"front": bomb, "wrist": bomb}),
        "8192x8192 JPEG declared 24x32": body({"front": EncodedImage("jpeg", *FRONT, bomb.data)}),
        "small JPEG whose header claims 8192x8192": body({"front": EncodedImage("jpeg", *FRONT, memoryview(lying))}),
    }


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def test_jpeg_bombs_are_refused_by_their_header_and_the_robot_keeps_streaming(port: int) -> None:
    policy = FixedComputePolicy(compute_ms=2)
    cases = bombs()
    async with (
        running_server(make_manifest(port, extra="[serving]\nmax_observation_bytes = 3000000\n"), policy) as (
            server,
            ready,
        ),
        PolicyClient.connect(client_settings(port), "robot-7", jpeg_quality=0) as victim,
        PolicyClient.connect(client_settings(port), "mallory") as mallory,
    ):
        session = await open_on(victim, ready)
        bad = await open_on(mallory, ready)
        peak_before = peak_rss_mb()
        async with streaming(session) as served, action_tap(mallory.zsession, bad.keys.action, bad.key) as tap:
            await still_streaming(served)
            for seq, (name, payload) in enumerate(cases.items(), start=100):
                attachment, ciphertext = sealed(bad, seq, payload)
                mallory.zsession.put(
                    bad.keys.obs, ciphertext, attachment=attachment, congestion_control=zenoh.CongestionControl.BLOCK
                )
                header, reply = await tap.next(lambda h, seq=seq: h is not None and h.seq_id == seq)
                assert header is not None
                assert header.msg_type == MSG_ERROR, name
                event = decode(reply, ErrorEvent)
                assert event.code == "bad_observation", name
                assert "8192" in event.message or "declared" in event.message, (name, event.message)
            await still_streaming(served)
        await session.close()
    # a decoded 8192x8192 frame is 192 MiB: none was ever made
    assert peak_rss_mb() - peak_before < 150
    assert metric(server, "servo_observations_rejected_total", reason="image") == len(cases)
    assert int(BOMBER_STATE) not in policy.served  # the bombs never reached the policy
    assert int(VICTIM_STATE) in policy.served


async def test_sessions_cannot_declare_cameras_beyond_the_pixel_cap_or_the_decode_budget(port: int) -> None:
    limits = "[limits]\nmax_image_pixels = 1000000\ndecode_budget_pixels = 1500000\n"
    two = {"front": FRONT, "wrist": FRONT}
    async with (
        running_server(make_manifest(port, extra=limits), FixedComputePolicy(cameras=two)) as (server, ready),
        PolicyClient.connect(client_settings(port), "mallory") as mallory,
    ):
        policy_features = ready.info.features
        for cameras, needle in (
            ({"front": CameraFeature(BOMB, BOMB), "wrist": CameraFeature(*FRONT)}, "1000000 pixels"),
            ({"front": CameraFeature(1000, 1000), "wrist": CameraFeature(1000, 1000)}, "decode budget"),
        ):
            features = Features(policy_features.state_names, policy_features.action_names, cameras)
            with pytest.raises(SessionRejected) as refused:
                await open_on(mallory, ready, features=features)
            assert refused.value.rejection.code == "cameras"
            assert needle in refused.value.rejection.reason
        # the same cameras within the bounds open (the reason above was the size, nothing else)
        fine = {"front": CameraFeature(1000, 1000), "wrist": CameraFeature(*FRONT)}
        features = Features(policy_features.state_names, policy_features.action_names, fine)
        await (await open_on(mallory, ready, features=features)).close()
    assert metric(server, "servo_sessions_rejected_total", code="cameras") == 2
