"""The openpi front door, driven by openpi's own client (``openpi-client`` from PyPI, unchanged).

Servers run in-process with the openpi frontend the manifest configures (as ``servo-serve`` starts
it); the openpi client is synchronous, so it runs on a worker thread. The test policy's chunk is
``state + 0.01 * step`` in every column, so a reply tells which observation it was computed from.
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import numpy as np
import pytest
import websockets.sync.client
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosed, InvalidStatus

from servo.policy import DecodedObservation, Prepared
from tests.frontends.helpers import aloha_obs, blocking, expected_chunk, front_door, served_until_closed
from tests.server.helpers import connected, metric, observation, open_on
from tests.server.policies import CHUNK, FixedComputePolicy, RelativeProcessor
from tests.support import eventually

pytestmark = [
    pytest.mark.anyio,
    # openpi-client 0.1.2 opens its connection the way websockets >= 17.1 deprecates; that is the
    # client's code, used here unchanged, not servo's.
    pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"),
]


async def test_openpi_client_gets_actions_computed_from_its_observation() -> None:
    policy = FixedComputePolicy(compute_ms=20)  # a forward pass the timing fields must show
    async with front_door(policy, openpi="metadata = {reset_pose = [0.0, 1.5]}") as (server, ready, port):

        def run() -> tuple[dict[str, Any], list[dict[str, Any]]]:
            client = WebsocketClientPolicy("127.0.0.1", port)
            try:
                return client.get_server_metadata(), [client.infer(aloha_obs(s)) for s in (3.0, 7.0)]
            finally:
                client._ws.close()

        metadata, replies = await blocking(run)
        assert metadata["reset_pose"] == [0.0, 1.5]  # the manifest's openpi metadata, as openpi sends it
        servo = metadata["servo"]
        assert servo["model"] == ready.info.model
        assert servo["action_names"] == ready.info.features.action_names
        assert servo["chunk_size"] == CHUNK
        assert servo["cameras"] == {"front": [24, 32]}
        assert servo["observation"] == {"state": ["state"], "cameras": {"front": "images/front"}, "prompt": "prompt"}
        for state, reply in zip((3.0, 7.0), replies, strict=True):
            assert reply["actions"].dtype == np.float32
            np.testing.assert_allclose(reply["actions"], expected_chunk(np.full(6, state)), rtol=1e-6)
            assert {"infer_ms", "queue_wait_ms"} <= set(reply["server_timing"])
            # the forward pass, and the whole request around it
            assert reply["policy_timing"]["infer_ms"] >= 20
            assert reply["server_timing"]["infer_ms"] >= reply["policy_timing"]["infer_ms"]
        assert "prev_total_ms" in replies[1]["server_timing"]  # openpi reports the previous cycle
        assert [r["servo"]["seq_id"] for r in replies] == [1, 2]
        assert policy.served[-2:] == [3, 7]
        # one ordinary servo session, counted and closed like a robot's
        assert metric(server, "servo_sessions_opened_total") == 1
        assert metric(server, "servo_requests_total", outcome="ok") == 2
        await server.wait_sessions(lambda sessions: not sessions)
        assert metric(server, "servo_sessions_collected_total", reason="closed") == 1


class TaskProcessor(RelativeProcessor):
    """Records the task each request reached the policy with."""

    tasks: list[str] = []

    def preprocess(self, obs: DecodedObservation) -> Prepared:
        self.tasks.append(obs.task)
        return super().preprocess(obs)


class TaskPolicy(FixedComputePolicy):
    def make_processor(self) -> TaskProcessor:
        return TaskProcessor()


async def test_droid_style_keys_are_mapped_in_the_manifest() -> None:
    TaskProcessor.tasks = []
    mapping = """
[frontends.openpi.observation]
state = ["observation/joint_position", "observation/gripper_position"]
cameras = {front = "observation/exterior_image_1_left"}
"""
    async with front_door(TaskPolicy(), openpi=mapping) as (_, _, port):
        obs = {
            "observation/joint_position": np.arange(5, dtype=np.float64),
            "observation/gripper_position": np.array([0.5]),
            "observation/exterior_image_1_left": np.zeros((24, 32, 3), np.uint8),
            "observation/wrist_image_left": np.zeros((8, 8, 3), np.uint8),  # not a policy camera: ignored
            "prompt": "put the marker in the cup",
        }

        def run() -> dict[str, Any]:
            client = WebsocketClientPolicy("127.0.0.1", port)
            try:
                return client.infer(obs)
            finally:
                client._ws.close()

        reply = await blocking(run)
    np.testing.assert_allclose(reply["actions"][0], [0, 1, 2, 3, 4, 0.5])
    assert TaskProcessor.tasks[-1] == "put the marker in the cup"


BAD = {
    "state too long": ({"state": np.zeros(7)}, "state: 'state' (7) gives 7 values, the policy takes 6"),
    "no state": ({"images": {}}, "observation has no 'state' (state)"),
    "no camera": ({"state": np.zeros(6)}, "observation has no 'images/front' (camera 'front')"),
    "frame without channels": (
        {"state": np.zeros(6), "images": {"front": np.zeros((24, 32), np.uint8)}},
        "'images/front' (camera 'front'): expected uint8 (H, W, 3) or (3, H, W), got uint8 (24, 32)",
    ),
    "empty frame": (
        {"state": np.zeros(6), "images": {"front": np.zeros((0, 32, 3), np.uint8)}},
        "expected uint8 (H, W, 3) or (3, H, W), got uint8 (0, 32, 3)",
    ),
    "float frame": (
        {"state": np.zeros(6), "images": {"front": np.zeros((24, 32, 3), np.float32)}},
        "got float32 (24, 32, 3)",
    ),
    "nan state": (
        {"state": np.full(6, np.nan), "images": {"front": np.zeros((24, 32, 3), np.uint8)}},
        "contains NaN or inf",
    ),
    "prompt not text": ({**aloha_obs(1.0), "prompt": 3}, "'prompt' (prompt): expected a string, got int"),
    "not a dict": ([1, 2, 3], "an observation must be a dict, got list"),
}


async def test_bad_observations_are_error_replies_and_the_connection_survives() -> None:
    policy = FixedComputePolicy()
    async with front_door(policy) as (_, _, port):

        def run() -> tuple[dict[str, str], dict[str, Any]]:
            client = WebsocketClientPolicy("127.0.0.1", port)
            errors = {}
            try:
                for case, (obs, _) in BAD.items():
                    with pytest.raises(RuntimeError) as refused:
                        client.infer(obs)
                    errors[case] = str(refused.value)
                return errors, client.infer(aloha_obs(2.0))
            finally:
                client._ws.close()

        errors, reply = await blocking(run)
    for case, (_, message) in BAD.items():
        assert errors[case].startswith("Error in inference server:\nservo: bad observation: "), case
        assert message in errors[case], case
        assert len(errors[case].splitlines()) == 2, case  # openpi's prefix line, then servo's one line
    np.testing.assert_allclose(reply["actions"][0], np.full(6, 2.0))
    assert policy.served[-1:] == [2]  # no bad one reached the policy


RAW_BAD = {
    "text frame": ("hello", "servo: bad request: expected a binary msgpack frame, got text"),
    "not msgpack": (b"\xc1", "servo: bad observation: not a msgpack message"),
    "object array": (
        msgpack_numpy.packb({"state": {b"__ndarray__": True, b"data": b"", b"dtype": "|O", b"shape": [0]}}),
        "servo: bad observation: $.state: unsupported array dtype '|O'",
    ),
    "short array data": (
        msgpack_numpy.packb({"state": {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "<f4", b"shape": [6]}}),
        "servo: bad observation: $.state: float32 array of shape (6,) needs 24 bytes, got 8",
    ),
}


async def test_malformed_frames_are_error_replies() -> None:
    async with front_door(FixedComputePolicy()) as (_, _, port):

        def run() -> tuple[dict[str, str | bytes], dict[str, Any]]:
            with websockets.sync.client.connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None) as ws:
                ws.recv()  # metadata
                errors = {}
                for case, (frame, _) in RAW_BAD.items():
                    ws.send(frame)
                    errors[case] = ws.recv()
                ws.send(msgpack_numpy.packb(aloha_obs(4.0)))
                return errors, msgpack_numpy.unpackb(ws.recv())

        errors, reply = await blocking(run)
    for case, (_, message) in RAW_BAD.items():
        assert isinstance(errors[case], str), case
        assert str(errors[case]).startswith(message), case
    np.testing.assert_allclose(reply["actions"][0], np.full(6, 4.0))


async def test_oversized_message_closes_the_connection_with_1009() -> None:
    async with front_door(FixedComputePolicy(), openpi="max_message_bytes = 4096") as (_, _, port):

        def run() -> ConnectionClosed:
            client = WebsocketClientPolicy("127.0.0.1", port)
            with pytest.raises(ConnectionClosed) as closed:
                client.infer({"state": np.zeros(6), "images": {"front": np.zeros((3, 64, 64), np.uint8)}})
            return closed.value

        closed = await blocking(run)
    assert closed.rcvd is not None
    assert closed.rcvd.code == 1009


async def test_episode_start_resets_the_servo_episode() -> None:
    async with front_door(FixedComputePolicy()) as (_, _, port):

        def run() -> list[dict[str, Any]]:
            with websockets.sync.client.connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None) as ws:
                ws.recv()
                out = []
                for message in (aloha_obs(1.0), {"__ctrl__": "episode_start"}, aloha_obs(1.0), {"__ctrl__": "x"}):
                    ws.send(msgpack_numpy.packb(message))
                    out.append(msgpack_numpy.unpackb(ws.recv()))
                return out

        before, ack, after, unknown = await blocking(run)
    assert before["servo"]["episode_id"] == 0
    assert ack == {"__ack__": "episode_start", "servo": {"episode_id": 1}}
    assert after["servo"]["episode_id"] == 1
    assert unknown == {"__ack__": "ignored"}


async def test_healthz_over_plain_http_on_the_same_port() -> None:
    async with front_door(FixedComputePolicy()) as (_, _, port):
        with anyio.fail_after(5):
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                await stream.send(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
                data = b""
                while b"\r\n\r\n" not in data or not data.endswith(b"OK\n"):
                    data += await stream.receive()
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert data.endswith(b"\r\n\r\nOK\n")


async def test_connections_over_the_limit_are_refused_with_503() -> None:
    async with front_door(FixedComputePolicy(), openpi="max_connections = 1") as (_, _, port):

        def run() -> int:
            first = WebsocketClientPolicy("127.0.0.1", port)
            try:
                with pytest.raises(InvalidStatus) as refused:
                    WebsocketClientPolicy("127.0.0.1", port)
                first.infer(aloha_obs(1.0))  # the admitted one is unaffected
                return refused.value.response.status_code
            finally:
                first._ws.close()

        assert await blocking(run) == 503


async def test_the_doors_capacity_is_its_own_and_drain_closes_with_a_reason(port: int) -> None:
    """openpi clients never take a robot's slot: the door holds ``max_connections`` sessions of its
    own, beside the robots' ``max_sessions``, and refuses the next one with HTTP 503."""
    serving, openpi = "max_sessions = 1", "max_connections = 2"
    async with front_door(FixedComputePolicy(), serving=serving, openpi=openpi) as (server, ready, ws_port):
        zenoh_port = int(server.manifest.zenoh.listen[0].rsplit(":", 1)[1])
        async with connected(zenoh_port, "robot") as robot:
            session = await open_on(robot, ready)  # the robots' only slot
            first = await blocking(WebsocketClientPolicy, "127.0.0.1", ws_port)
            second = await blocking(WebsocketClientPolicy, "127.0.0.1", ws_port)
            assert len(server.registry) == 3
            assert server.registry.robots() == 1
            (status,) = await robot.discover()
            assert (status.status.active_sessions, status.status.max_sessions) == (1, 1)

            def refused() -> int:
                with pytest.raises(InvalidStatus) as closed:
                    WebsocketClientPolicy("127.0.0.1", ws_port)
                return closed.value.response.status_code

            assert await blocking(refused) == 503
            assert metric(server, "servo_sessions_rejected_total", code="capacity") == 0
            await blocking(second._ws.close)  # off the loop: the server answers the close handshake
            server.drain()

            gone = await blocking(served_until_closed, first, 15.0, "the drain")
            assert gone.rcvd is not None
            assert gone.rcvd.code == 1001
            assert "draining" in gone.rcvd.reason
            await session.close()


async def test_openpi_clients_and_robots_share_the_server_fairly() -> None:
    """Two openpi clients and two Zenoh robots, all closed-loop: round-robin serves each alike."""
    policy = FixedComputePolicy(compute_ms=10)
    async with front_door(policy) as (server, ready, ws_port):
        zenoh_port = int(server.manifest.zenoh.listen[0].rsplit(":", 1)[1])
        stop = threading.Event()
        wrong: list[str] = []

        def openpi_client(ident: int) -> None:
            client = WebsocketClientPolicy("127.0.0.1", ws_port)
            try:
                while not stop.is_set():
                    if client.infer(aloha_obs(ident))["actions"][0][0] != ident:
                        wrong.append(f"openpi {ident}")
            finally:
                client._ws.close()

        async def robot(ident: int) -> None:
            async with connected(zenoh_port, f"robot-{ident}") as client:
                session = await open_on(client, ready)
                while not stop.is_set():
                    if (await session.infer(*observation(ident), timeout=5)).chunk_robot[0][0] != ident:
                        wrong.append(f"robot {ident}")
                await session.close()

        served_before = len(policy.served)
        async with anyio.create_task_group() as tg:
            for ident in (1, 2):
                tg.start_soon(blocking, openpi_client, ident)
            for ident in (3, 4):
                tg.start_soon(robot, ident)
            await eventually(lambda: len(policy.served) >= served_before + 40, timeout=15)
            stop.set()
    served = policy.served[served_before:]
    counts = [served.count(ident) for ident in (1, 2, 3, 4)]
    assert wrong == []
    assert min(counts) >= 0.6 * max(counts), counts
