"""`SyncPolicyClient`: openpi's blocking ``infer`` over servo, from plain threads and scripts."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import msgspec
import numpy as np
import pytest

from servo.client import SyncPolicyClient
from servo.policy import DecodedObservation, Prepared
from servo.wire import CameraFeature, WireError
from tests.server.helpers import metric, server_manifest
from tests.server.policies import CHUNK, FixedComputePolicy, RelativeProcessor, StickyPolicy
from tests.support import running_server

pytestmark = pytest.mark.anyio

T = TypeVar("T")


async def blocking(fn: Callable[..., T], *args: Any) -> T:
    with anyio.fail_after(20):
        return await anyio.to_thread.run_sync(fn, *args)


def obs(state: float) -> dict[str, Any]:
    return {"state": np.full(6, state), "images": {"front": np.zeros((24, 32, 3), np.uint8)}, "prompt": "stack"}


async def test_round_trip_reset_metadata_and_close(port: int) -> None:
    async with running_server(server_manifest(port), policy=StickyPolicy()) as (server, ready):

        def run() -> tuple[dict[str, Any], list[dict[str, Any]], int]:
            with SyncPolicyClient(f"tcp/127.0.0.1:{port}", jpeg_quality=0) as client:
                metadata = client.get_server_metadata()
                replies = [client.infer(obs(3.0)), client.infer(obs(9.0))]
                episode = client.reset()
                replies.append(client.infer(obs(9.0)))
            client.close()  # idempotent
            with pytest.raises(RuntimeError, match="closed"):
                client.infer(obs(1.0))
            return metadata, replies, episode

        metadata, replies, episode = await blocking(run)
        assert metadata["model"] == ready.info.model
        assert metadata["action_names"] == ready.info.features.action_names
        assert metadata["chunk_size"] == CHUNK
        # StickyProcessor answers anchor (the episode's first state) + requests in the episode
        first, second, after_reset = (r["actions"] for r in replies)
        assert first.shape == (CHUNK, 6)
        assert first.dtype == np.float32
        assert (first == 3 + 1).all()
        assert (second == 3 + 2).all()
        assert episode == 1
        assert (after_reset == 9 + 1).all()  # a new episode: the session's processor was reset
        assert [r["servo"]["episode_id"] for r in replies] == [0, 0, 1]
        assert all(r["servo"]["round_trip_ms"] > 0 for r in replies)
        assert {"infer_ms", "queue_wait_ms"} <= set(replies[0]["server_timing"])
        await server.wait_sessions(lambda sessions: not sessions)
        assert metric(server, "servo_sessions_collected_total", reason="closed") == 1


class PixelProcessor(RelativeProcessor):
    """Keeps the frames that reach the policy."""

    frames: list[np.ndarray] = []

    def preprocess(self, observation: DecodedObservation) -> Prepared:
        self.frames.append(np.array(observation.images["front"]))
        return super().preprocess(observation)


class PixelPolicy(FixedComputePolicy):
    def make_processor(self) -> PixelProcessor:
        return PixelProcessor()


async def test_frames_travel_raw_by_default_so_the_policy_computes_on_exactly_them(port: int) -> None:
    PixelProcessor.frames = []
    frame = np.random.default_rng(3).integers(0, 256, (24, 32, 3), dtype=np.uint8)  # JPEG would not keep it
    async with running_server(server_manifest(port), policy=PixelPolicy()):

        def run() -> None:
            with SyncPolicyClient(f"tcp/127.0.0.1:{port}") as client:
                client.infer({"state": np.zeros(6), "images": {"front": frame}})

        await blocking(run)
    np.testing.assert_array_equal(PixelProcessor.frames[-1], frame)


async def test_declared_cameras_of_another_size_are_what_frames_are_held_to(port: int) -> None:
    PixelProcessor.frames = []
    async with running_server(server_manifest(port), policy=PixelPolicy()) as (_, ready):
        features = msgspec.structs.replace(ready.info.features, cameras={"front": CameraFeature(48, 64)})

        def run() -> str:
            with SyncPolicyClient(f"tcp/127.0.0.1:{port}", features=features, fps=30) as client:
                client.infer({"state": np.zeros(6), "images": {"front": np.zeros((48, 64, 3), np.uint8)}})
                with pytest.raises(WireError) as refused:
                    client.infer(obs(1.0))  # the policy's own size, but not what this session declared
                return str(refused.value)

        error = await blocking(run)
    # Held to the declared size on the way in; what reaches the policy is its own size (shrunk).
    assert PixelProcessor.frames[-1].shape == (24, 32, 3)
    assert error == "'images/front' (camera 'front'): this session's frames are 48x64 (height x width), got 24x32"


async def test_bad_observation_names_the_key_and_the_client_goes_on(port: int) -> None:
    async with running_server(server_manifest(port), policy=FixedComputePolicy()):

        def run() -> tuple[str, np.ndarray]:
            with SyncPolicyClient(f"tcp/127.0.0.1:{port}", jpeg_quality=0) as client:
                with pytest.raises(WireError) as refused:
                    client.infer({"state": np.zeros(6), "images": {"front": np.zeros((3, 8, 8), np.uint8)}})
                return str(refused.value), client.infer(obs(4.0))["actions"]

        error, actions = await blocking(run)
    assert error == "'images/front' (camera 'front'): this session's frames are 24x32 (height x width), got 8x8"
    np.testing.assert_allclose(actions[0], np.full(6, 4.0))


SCRIPT = """
import sys
import numpy as np
from servo.client import SyncPolicyClient

client = SyncPolicyClient("tcp/127.0.0.1:{port}", jpeg_quality=0)
reply = client.infer({{"state": np.full(6, 2.0), "images": {{"front": np.zeros((24, 32, 3), np.uint8)}}}})
print(reply["actions"][0][0])
{ending}
"""


@pytest.mark.parametrize("ending", ["client.close()", "pass  # never closed", "sys.exit(3)"])
async def test_a_script_exits_and_its_session_is_closed(port: int, ending: str) -> None:
    async with running_server(server_manifest(port), policy=FixedComputePolicy()) as (server, _):
        with anyio.fail_after(30):
            done = await anyio.run_process(
                [sys.executable, "-c", textwrap.dedent(SCRIPT.format(port=port, ending=ending))], check=False
            )
        assert done.returncode == (3 if "exit" in ending else 0), done.stderr.decode()[-2000:]
        assert done.stdout.decode().strip() == "2.0"
        # closed by the script (or for it, at exit): told at once, not collected as vanished later
        await server.wait_sessions(lambda sessions: not sessions)
        assert metric(server, "servo_sessions_collected_total", reason="closed") == 1
        assert metric(server, "servo_sessions_collected_total", reason="vanished") == 0
