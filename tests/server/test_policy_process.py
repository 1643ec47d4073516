"""``model.process = "separate"``: the policy in a process of its own, served as if it were inline.

In process: the chunks equal a local runner's, errors read as they would inline (a load failure:
``tests/server/test_cli.py``, servo-serve's one-line errors). As processes, the way a user runs
``servo-serve``: the server maps no torch, a killed server takes its policy process with it, and
a server whose policy process dies exits at once (status 70) so its robots move on.
"""

from __future__ import annotations

import mmap
import os
import signal
import socket
import sys
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import numpy as np
import pytest

from servo.client import RemoteSession, ServerError
from servo.policy.channel import Body, Channel, ChannelClosed, Infer
from servo.policy.reference import ReferencePolicy
from servo.policy.runner import InferenceRunner, synthetic_observation
from servo.server.manifest import parse_manifest
from servo.server.policy_process import POLICY_LOST_STATUS
from testbed.processes import ended
from tests.edge.harness import Proc, write_manifest
from tests.server.helpers import connected, metric, observation, open_on
from tests.support import camera_frames, free_port, make_manifest, running_server

pytestmark = pytest.mark.anyio

SMALL = {"front": (48, 64), "wrist": (48, 64)}
#: Far beyond any start-up (a child importing torch on a loaded machine): reaching it fails the test.
START_S = 180.0


@pytest.mark.parametrize(("height", "width"), [(48, 64), (480, 640)], ids=["on-the-stream", "through-the-arena"])
async def test_a_policy_process_serves_the_chunks_a_local_runner_computes(port: int, height: int, width: int) -> None:
    size = f"[{height}, {width}]"
    manifest = make_manifest(port, options=f"cameras = {{front = {size}, wrist = {size}}}")
    assert manifest.model.process == "separate"  # the default
    local = ReferencePolicy(cameras={"front": (height, width), "wrist": (height, width)})  # same seed
    runner = InferenceRunner(local)
    async with running_server(manifest) as (_, ready), connected(port, "robot") as client:
        assert ready.paths["process"] == "separate"
        assert ready.policy_pid is not None
        session = await open_on(client, ready)
        for seed in range(3):
            frames = camera_frames(height, width, seed=seed)
            state = np.linspace(-5, 5, 6, dtype=np.float32) * (seed + 1)
            result = await session.infer(state, frames, timeout=30)
            obs = synthetic_observation(local)
            obs.state, obs.images = state, frames
            model, robot = runner.infer(local.make_processor(), obs, 0)
            np.testing.assert_allclose(result.chunk_model, model, atol=1e-5)
            np.testing.assert_allclose(result.chunk_robot, robot, atol=1e-5)
        arenas = [line.split()[1] for line in _maps(ready.policy_pid).splitlines() if "servo-policy-link" in line]
        # Frames of 2 x 921 kB come through the server's arena, which the child can only read.
        assert arenas == (["r--s"] if height == 480 else [])
        held = _memfds(ready.policy_pid)
        assert [_access_mode(ready.policy_pid, fd) for fd in held] == ([os.O_RDONLY] if height == 480 else [])
        for fd in held:  # opened again for writing, as the child itself could: still not writable
            again = os.open(f"/proc/{ready.policy_pid}/fd/{fd}", os.O_RDWR)
            try:
                with pytest.raises(PermissionError):
                    mmap.mmap(again, mmap.PAGESIZE)
            finally:
                os.close(again)
        await session.close()


def _memfds(pid: int) -> list[str]:
    """The descriptors of memfds that process ``pid`` holds."""
    return [fd for fd in os.listdir(f"/proc/{pid}/fd") if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:")]


def _access_mode(pid: int, fd: str) -> int:
    flags = next(line for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines() if line.startswith("flags"))
    return int(flags.split()[1], 8) & os.O_ACCMODE


async def test_a_failing_forward_reads_as_it_would_inline_and_the_next_one_is_served(port: int) -> None:
    manifest = make_manifest(port, source="tests.server.policies:make_failing", options="")
    async with running_server(manifest) as (_, ready), connected(port, "robot") as client:
        session = await open_on(client, ready)
        with pytest.raises(ServerError) as info:
            await session.infer(*observation(-1.0, cameras={}), timeout=30)
        assert (info.value.code, info.value.message) == (
            "inference_failed",
            "RuntimeError: policy bug on negative input",
        )
        result = await session.infer(*observation(3.0, cameras={}), timeout=30)
        assert result.chunk_robot[0][0] == 3  # its own processor: the state it cached, added back
        await session.close()


async def test_sessions_queued_behind_a_forward_are_batched_in_the_policy_process(port: int) -> None:
    # 4 robots send at once; the first one's forward takes 1 s (a busy machine still sends the other
    # three within it): what queued behind it is served in one forward. Warm-up: batches of 1 to 4.
    source, serving = "tests.server.policies:make_batching", "[serving]\nmax_sessions = 4\n"
    manifest = make_manifest(port, source=source, options="compute_ms = 1000", extra=serving)
    async with running_server(manifest) as (server, ready), AsyncExitStack() as stack:
        sessions = [await open_on(await stack.enter_async_context(connected(port, f"r{i}")), ready) for i in range(4)]
        results: dict[int, np.ndarray] = {}

        async def robot(i: int, session: RemoteSession) -> None:
            results[i] = (await session.infer(*observation(float(i + 1), cameras={}), timeout=30)).chunk_robot

        async with anyio.create_task_group() as tg:
            for i, session in enumerate(sessions):
                tg.start_soon(robot, i, session)
        for i, chunk in results.items():
            assert chunk[0][0] == i + 1  # each on its own processor's state
        served = metric(server, "servo_batch_size_sum")
        assert served == 4
        assert metric(server, "servo_batch_size_count") < served  # a forward served two or more
        for session in sessions:
            await session.close()


def test_frames_decoded_on_the_device_need_the_policy_inline() -> None:
    text = '[model]\nsource = "reference"\nframes = "device"\n'
    with pytest.raises(Exception, match=r'model\.process = "inline"'):
        parse_manifest(text)
    assert parse_manifest(text.replace("[model]\n", '[model]\nprocess = "inline"\n')).model.frames == "device"


def test_the_link_refuses_what_is_not_a_message_before_allocating_it() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall((64).to_bytes(4, "little") + (1 << 40).to_bytes(8, "little") + b"\x00")
        with pytest.raises(ChannelClosed, match="too large"):
            Channel(ours, arena="writes").receive()
        theirs.sendall((3).to_bytes(4, "little") + (0).to_bytes(8, "little") + b"\x00" + b"\xc1\x00\x00")
        with pytest.raises(ChannelClosed, match="malformed"):
            Channel(ours, arena="writes").receive()
        theirs.close()
        with pytest.raises(ChannelClosed, match="closed"):
            Channel(ours, arena="writes").receive()


def test_arrays_cross_the_link_unchanged() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        obs = synthetic_observation(ReferencePolicy(cameras=SMALL))
        obs.state = np.arange(6, dtype=np.float32)
        obs.images = camera_frames(48, 64)
        obs.prefix_robot = np.ones((4, 6), np.float32)
        body = Body()
        Channel(theirs, arena="writes").send(Infer([body.observation(7, obs, 3)]), body)
        message, arrays = Channel(ours, arena="reads").receive()
        assert isinstance(message, Infer)
        (request,) = message.requests
        got = arrays.observation(request)
        assert (request.processor, request.delay, got.prefix_model) == (7, 3, None)
        np.testing.assert_array_equal(got.state, obs.state)
        np.testing.assert_array_equal(got.prefix_robot, obs.prefix_robot)
        for name, frame in obs.images.items():
            np.testing.assert_array_equal(got.images[name], frame)


def _serve(tmp_path: Path, port: int, *, options: str = "cameras = {front = [48, 64]}") -> tuple[Proc, int]:
    """``servo-serve`` as a user runs it, ready, and its policy process's pid.

    One session at most: a slow forward is warmed once, not once per batch size.
    """
    manifest = write_manifest(tmp_path / "manifest.toml", port, options=options, extra="[serving]\nmax_sessions = 1")
    # As under systemd (nothing listens there: the server's notifier only sends).
    env = {"HOME": str(tmp_path), "NOTIFY_SOCKET": str(tmp_path / "notify")}
    proc = Proc([sys.executable, "-m", "servo.cli.serve", str(manifest), "--log-level", "debug"], env=env)
    proc.wait_line("servo-serve: ready", START_S)
    children = Path(f"/proc/{proc.popen.pid}/task/{proc.popen.pid}/children").read_text().split()
    assert len(children) == 1, children
    return proc, int(children[0])


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def _environ(pid: int) -> str:
    return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
async def test_a_killed_server_maps_no_torch_and_takes_its_policy_process_with_it(tmp_path: Path) -> None:
    proc, child = _serve(tmp_path, free_port())
    try:
        assert "libtorch" not in _maps(proc.popen.pid)
        assert "libtorch" in _maps(child)
        assert "NOTIFY_SOCKET=" not in _environ(child)  # the service is the server, not its policy process
        proc.kill()
        assert await anyio.to_thread.run_sync(ended, child, 30), "the policy process outlived its server"
    finally:
        proc.kill()


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
@pytest.mark.parametrize("moment", ["idle", "mid-forward"])
async def test_a_server_whose_policy_process_dies_exits_at_once_and_its_robot_sees_it(
    tmp_path: Path, moment: str
) -> None:
    port = free_port()
    # A 2 s forward: the kill lands inside it, not between requests.
    proc, child = _serve(tmp_path, port, options="cameras = {front = [48, 64]}\ncompute_ms = 2000")
    try:
        async with connected(port, "robot") as client:
            (server,) = await client.discover()
            session = await client.open_session(
                server, features=server.status.policy.features, fps=server.status.policy.fps
            )
            if moment == "mid-forward":
                await session.send(*observation(1.0, cameras={"front": (48, 64)}))
                await anyio.to_thread.run_sync(proc.wait_line, "inference started", 60.0)
            os.kill(child, signal.SIGKILL)
            assert await anyio.to_thread.run_sync(proc.wait, 60.0) == POLICY_LOST_STATUS
            with anyio.fail_after(30):
                await session.lost.wait()  # the server went with its policy: the robot moves on
        assert "policy process lost" in proc.output
    finally:
        proc.kill()
