"""The openpi front door takes frames of any size, as a robot's: the session declares what it sees.

Driven by openpi's own client (``openpi-client`` from PyPI, unchanged), like ``test_openpi``.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from servo.policy import DecodedObservation, Prepared
from servo.server import robots
from tests.frontends.helpers import aloha_obs, blocking, expected_chunk, front_door
from tests.server.helpers import metric
from tests.server.policies import FixedComputePolicy, RelativeProcessor

pytestmark = [
    pytest.mark.anyio,
    # openpi-client 0.1.2 opens its connection the way websockets >= 17.1 deprecates; that is the
    # client's code, used here unchanged, not servo's.
    pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"),
]


class FrameProcessor(RelativeProcessor):
    """Records the size of every frame that reaches the policy."""

    sizes: list[tuple[int, ...]] = []

    def preprocess(self, obs: DecodedObservation) -> Prepared:
        self.sizes.append(obs.images["front"].shape)
        return super().preprocess(obs)


class FramePolicy(FixedComputePolicy):
    def make_processor(self) -> FrameProcessor:
        return FrameProcessor()


async def test_frames_of_any_size_reach_the_policy_as_a_robots_do() -> None:
    """The session declares the size the client sends; the policy gets its own size, as from a robot
    (larger frames are shrunk by the server, `servo.wire.downsize`)."""
    FrameProcessor.sizes = []
    async with front_door(FramePolicy(), openpi="metadata = {}") as (server, _, port):

        def run() -> list[dict[str, Any]]:
            client = WebsocketClientPolicy("127.0.0.1", port)
            try:
                return [
                    client.infer(aloha_obs(1.0, size=(224, 224))),  # ALOHA's channels-first 224x224
                    client.infer(aloha_obs(2.0, size=(224, 224))),
                    client.infer(aloha_obs(3.0, size=(48, 64))),  # another size mid-connection
                    client.infer(aloha_obs(4.0)),  # the policy's own
                ]
            finally:
                client._ws.close()

        replies = await blocking(run)
        await server.wait_sessions(lambda sessions: not sessions)
    assert FrameProcessor.sizes[-4:] == [(24, 32, 3)] * 4
    for state, reply in zip((1.0, 2.0, 3.0, 4.0), replies, strict=True):
        np.testing.assert_allclose(reply["actions"], expected_chunk(np.full(6, state)), rtol=1e-6)
    # One session at a time: each new size replaced the session in place (connect + 3 sizes).
    assert metric(server, "servo_sessions_opened_total") == 4
    assert metric(server, "servo_sessions_rejected_total", code="session_exists") == 0
    assert metric(server, "servo_requests_total", outcome="ok") == 4


async def test_frames_too_large_for_the_server_are_refused_and_the_connection_goes_on() -> None:
    async with front_door(FixedComputePolicy(), extra="[limits]\nmax_image_pixels = 10000") as (_, _, port):

        def run() -> tuple[str, dict[str, Any]]:
            client = WebsocketClientPolicy("127.0.0.1", port)
            try:
                with pytest.raises(RuntimeError) as refused:
                    client.infer(aloha_obs(1.0, size=(120, 160)))  # 19200 pixels
                return str(refused.value), client.infer(aloha_obs(2.0))
            finally:
                client._ws.close()

        error, reply = await blocking(run)
    assert "servo: bad observation: frames of this size refused: cameras: camera 'front' declares 120x160" in error
    np.testing.assert_allclose(reply["actions"][0], np.full(6, 2.0))


async def test_an_unknown_camera_or_an_absurd_frame_is_refused_naming_the_key() -> None:
    async with front_door(FixedComputePolicy(), openpi="metadata = {}") as (_, _, port):

        def run() -> tuple[list[str], dict[str, Any]]:
            client = WebsocketClientPolicy("127.0.0.1", port)
            try:
                extra = aloha_obs(1.0)
                extra["images"]["left_wrist"] = np.zeros((3, 24, 32), np.uint8)
                errors = []
                for bad in (extra, aloha_obs(2.0, size=(1, 1))):
                    with pytest.raises(RuntimeError) as refused:
                        client.infer(bad)
                    errors.append(str(refused.value))
                return errors, client.infer(aloha_obs(3.0))  # the connection goes on
            finally:
                client._ws.close()

        (unknown, tiny), reply = await blocking(run)
    assert (
        "servo: bad observation: 'images/left_wrist': the policy has no camera 'left_wrist' (it has front); send only "
        "its cameras, or map yours in [frontends.openpi.observation] cameras"
    ) in unknown
    assert (
        "servo: bad observation: 'images/front' (camera 'front'): a 1x1 frame; the policy takes 24x32 and frames are "
        "enlarged at most 8x: send at least 3x4 (height x width)"
    ) in tiny
    np.testing.assert_allclose(reply["actions"][0], np.full(6, 3.0))


async def test_a_connection_long_after_the_start_opens_without_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replica hands out a new open nonce every period; the front door opens with a current one."""
    period = 0.5
    monkeypatch.setattr(robots, "NONCE_PERIOD_S", period)
    async with front_door(FixedComputePolicy(), openpi="metadata = {}") as (server, _, port):
        await anyio.sleep(2.5 * period)  # time itself is the input: the start's nonce is no longer accepted

        def run() -> list[dict[str, Any]]:
            client = WebsocketClientPolicy("127.0.0.1", port)
            try:  # the second size reopens the session: a second open
                return [client.infer(aloha_obs(1.0)), client.infer(aloha_obs(2.0, size=(48, 64)))]
            finally:
                client._ws.close()

        await blocking(run)
        assert metric(server, "servo_sessions_opened_total") == 2
        assert metric(server, "servo_sessions_rejected_total", code="stale_nonce") == 0
