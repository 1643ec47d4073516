"""The legacy inline loop of bench_edge.py (docs/design/control-loop.md §1, on purpose).

The control thread reads the robot, JPEG-encodes both frames, publishes and *blocks* until the
chunk is back, all inline, on the same absolute-deadline schedule as servo's loop, so the only
difference is where the I/O happens.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import anyio
import numpy as np
import numpy.typing as npt
import zenoh

from benches._edge_rig import JPEG_QUALITY, Breakdown, LoopResult, ServerProcess, lateness_histogram
from servo._core import MSG_CHUNK, MSG_OBS, SCHEMA_VERSION, ActionQueue, Header, SessionKey
from servo.client import PolicyClient
from servo.edge.config import EdgeConfig
from servo.edge.observation import robot_features
from servo.edge.realtime import request_realtime
from servo.edge.safety import SafetyLimiter
from servo.robots import SimCameras, SimConfig, SimSO100
from servo.transport import ZenohSettings, declare_obs_publisher
from servo.wire import ActionChunk, Observation, decode, decode_tensor, encode, encode_image, encode_tensor

FloatArray = npt.NDArray[np.float32]


class NaiveLoop:
    """Everything inline on the control thread (docs/design/control-loop.md §1). Owned by that thread."""

    def __init__(
        self,
        robot: SimSO100,
        cameras: SimCameras,
        zsession: zenoh.Session,
        obs_key: str,
        action_key: str,
        epoch: int,
        session_id: bytes,
        key: SessionKey,
    ) -> None:
        self.robot = robot
        self.cameras = cameras
        self.period_ns = round(1e9 / robot.spec.fps)
        self.epoch = epoch
        self.session_id = session_id
        self.key = key
        self.queue = ActionQueue(robot.spec.action_dim, rtc=True)
        self.limiter = SafetyLimiter(robot.spec)
        self.buffer_steps = EdgeConfig().pipeline.buffer_time_s * robot.spec.fps
        self.lateness_ns: list[int] = []
        self.missed_deadlines = 0
        self.ticks = 0
        self.requests: list[Breakdown] = []
        self.error = ""
        self._seq = 0
        self._reply: tuple[Header, bytes, int] | None = None
        self._arrived = threading.Event()
        self._publisher = declare_obs_publisher(zsession, obs_key)
        self._subscriber = zsession.declare_subscriber(action_key, self._on_action)

    def _on_action(self, sample: zenoh.Sample) -> None:
        if sample.attachment is None:
            return
        header, payload = self.key.decrypt(sample.attachment.to_bytes(), sample.payload.to_bytes())
        if header.msg_type == MSG_CHUNK and header.seq_id == self._seq:
            self._reply = (header, payload, time.monotonic_ns())
            self._arrived.set()

    def close(self) -> None:
        self._subscriber.undeclare()
        self._publisher.undeclare()

    def run(self, duration_s: float, *, realtime: bool) -> None:
        if realtime:
            request_realtime()
        self.limiter.start_from(self.robot.read_state())
        end = time.monotonic_ns() + round(duration_s * 1e9)
        next_ns = time.monotonic_ns()
        wait = threading.Event()
        try:
            while next_ns < end:
                now = time.monotonic_ns()
                self.lateness_ns.append(now - next_ns)
                self._tick(now)
                self.ticks += 1
                next_ns += self.period_ns
                after = time.monotonic_ns()
                if after > next_ns:
                    late = (after - next_ns) // self.period_ns + 1
                    self.missed_deadlines += int(late)
                    next_ns += late * self.period_ns
                wait.wait((next_ns - time.monotonic_ns()) / 1e9)
        except Exception as exc:
            self.error = repr(exc)

    def _tick(self, now: int) -> None:
        state = self.robot.read_state()
        frames = self.cameras.read_cameras()
        if self.queue.qsize() < self.buffer_steps:
            self._request(state, frames, now)
        action = self.queue.get()
        if action is not None:
            self.robot.send_action(self.limiter.apply(action))

    def _request(self, state: FloatArray, frames: dict[str, Any], now: int) -> None:
        started = time.perf_counter()
        images = {name: encode_image(frame, JPEG_QUALITY) for name, frame in frames.items()}
        body = encode(Observation(state=encode_tensor(state), images=images))
        encode_ms = (time.perf_counter() - started) * 1e3
        self._seq += 1
        header = Header(SCHEMA_VERSION, MSG_OBS, 0, self._seq, 0, self.epoch, now, self.session_id)
        self._arrived.clear()
        self._reply = None
        attachment, ciphertext = self.key.encrypt(header, body)
        self._publisher.put(ciphertext, attachment=attachment)
        if not self._arrived.wait(5.0) or self._reply is None:  # blocks the control loop
            return
        _, payload, arrived_ns = self._reply
        chunk = decode(payload, ActionChunk)
        robot = np.asarray(decode_tensor(chunk.chunk_robot, dtype="float32"), dtype=np.float32)
        model = robot if chunk.chunk_model is None else np.asarray(decode_tensor(chunk.chunk_model), dtype=np.float32)
        rtt = (arrived_ns - now) / 1e6
        merge_started = time.perf_counter_ns()
        self.queue.merge(model, robot, math.ceil(rtt * 1e6 / self.period_ns))
        merge_ms = (time.perf_counter_ns() - merge_started) / 1e6
        transport = rtt - chunk.queue_wait_ms - chunk.inference_ms - encode_ms
        self.requests.append(Breakdown(encode_ms, transport, chunk.queue_wait_ms, chunk.inference_ms, rtt, merge_ms))


async def run_naive(server: ServerProcess, fps: float, duration_s: float) -> LoopResult:
    """The legacy loop against the same server (a session opened the normal way first)."""
    sim = SimSO100(SimConfig(fps=fps))
    cameras = SimCameras(sim.config, sim)
    await anyio.to_thread.run_sync(sim.connect)
    await anyio.to_thread.run_sync(cameras.connect)
    try:
        settings = ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{server.port}"])
        async with PolicyClient.connect(settings, "naive-bench") as client:
            (info,) = await client.discover()
            session = await client.open_session(info, features=robot_features(sim.spec), fps=fps, rtc=True, epoch=1)
            keys = session.keys
            naive = NaiveLoop(
                sim,
                cameras,
                client.zsession,
                keys.obs,
                keys.action,
                epoch=1,
                session_id=session.wire_id,
                key=session.key,
            )
            try:
                await anyio.to_thread.run_sync(lambda: naive.run(duration_s, realtime=True))
            finally:
                naive.close()
                await session.close()
    finally:
        await anyio.to_thread.run_sync(cameras.disconnect)
        await anyio.to_thread.run_sync(sim.disconnect)
    return LoopResult(
        design="naive (inline I/O)",
        fps=fps,
        duration_s=duration_s,
        ticks=naive.ticks,
        missed_deadlines=naive.missed_deadlines,
        lateness_counts=lateness_histogram(naive.lateness_ns),
        lateness_max_ms=max((abs(ns) for ns in naive.lateness_ns), default=0) / 1e6,
        requests=naive.requests,
        chunks=len(naive.requests),
        realtime=True,
        where="control thread",
        final_state="n/a",
        error=naive.error,
    )
