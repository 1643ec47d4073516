"""A fleet of servo clients against a policy server in another process (bench_server.py).

Two halves:

* ``python benches/_fleet.py serve --port P ...`` runs a `PolicyServer` whose policy sleeps a
  fixed time in ``predict_chunk`` (a sleep releases the GIL like a GPU forward does) and prints
  ``READY`` on stdout once it serves; SIGTERM drains it.
* `run_fleet` runs N clients in the calling process's event loop, each sending as fast as one
  request in flight allows, and returns per-request samples.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np

from servo.policy import DecodedObservation, PolicySpec, Prepared
from servo.wire import CameraFeature, Features

JOINTS = ("j0", "j1", "j2", "j3", "j4", "j5")
CHUNK = 50
FPS = 30.0


class _Relative:
    """Per-session processor: the chunk is relative to the state seen at preprocess."""

    def __init__(self, cameras: dict[str, CameraFeature]) -> None:
        self._cameras = cameras
        self._state: np.ndarray | None = None

    def preprocess(self, obs: DecodedObservation) -> Prepared:
        for name, cam in self._cameras.items():
            frame = obs.images[name]
            if frame.shape != (cam.height, cam.width, 3):
                raise ValueError(f"camera {name}: {frame.shape}")
        self._state = np.array(obs.state, dtype=np.float32)
        return Prepared(batch=None, prefix=None)

    def postprocess(self, chunk: np.ndarray) -> np.ndarray:
        assert self._state is not None
        return chunk + self._state

    def reset(self) -> None:
        self._state = None


class FixedComputePolicy:
    """Chunk-stateless policy whose forward takes exactly ``compute_ms`` (sleep, GIL released).

    The model-space chunk is ``0, 0.001, 0.002, …`` per step, so ``chunk_robot[0] == state``: a
    client can check every chunk was anchored on its own observation.
    """

    def __init__(self, compute_ms: float = 20.0, height: int = 480, width: int = 640) -> None:
        self.compute_s = compute_ms / 1e3
        cameras = {"front": CameraFeature(height, width), "wrist": CameraFeature(height, width)}
        self._cameras = cameras
        self._spec = PolicySpec(
            model="bench/fixed",
            revision="v1",
            features=Features(state_names=list(JOINTS), action_names=list(JOINTS), cameras=cameras),
            chunk_size=CHUNK,
            fps=FPS,
            supports_rtc=False,
            chunk_stateless=True,
        )
        steps = np.arange(CHUNK, dtype=np.float32)[:, None] * np.float32(0.001)
        self._chunk = np.ascontiguousarray(np.repeat(steps, len(JOINTS), axis=1))

    @property
    def spec(self) -> PolicySpec:
        return self._spec

    def make_processor(self) -> _Relative:
        return _Relative(self._cameras)

    def predict_chunk(self, batch: Any, inference_delay: int, prefix: Any) -> np.ndarray:
        deadline = time.perf_counter() + self.compute_s
        time.sleep(self.compute_s)
        while time.perf_counter() < deadline:  # sleep() may wake a hair early
            pass
        return self._chunk

    def reset(self) -> None:
        pass


# ---------------------------------------------------------------------------- server process
def manifest_text(port: int, *, health_port: int = 0, max_sessions: int = 32) -> str:
    return f"""
[model]
source = "bench"
warmup = 2
[serving]
app = "bench"
max_sessions = {max_sessions}
client_grace_s = 2.0
[zenoh]
listen = ["tcp/127.0.0.1:{port}"]
[ops]
health_port = {health_port}
"""


async def _serve(args: argparse.Namespace) -> None:
    from servo.cli.signals import on_signal
    from servo.server.manifest import parse_manifest
    from servo.server.service import PolicyServer

    manifest = parse_manifest(manifest_text(args.port))
    policy = FixedComputePolicy(args.compute_ms, args.height, args.width)
    server = PolicyServer(manifest, policy=policy)
    async with anyio.create_task_group() as tg:

        async def run_server(*, task_status: Any) -> None:
            await server.run(task_status=task_status)
            tg.cancel_scope.cancel()

        tg.start_soon(on_signal, server.drain)
        await tg.start(run_server)
        print("READY", flush=True)


def serve_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="_fleet.py serve")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--compute-ms", type=float, default=20.0)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    from servo.logs import configure_logging

    configure_logging(args.log_level)
    anyio.run(_serve, args, backend="asyncio", backend_options={"use_uvloop": True})


# ---------------------------------------------------------------------------- client side
@dataclass
class Sample:
    """One served request as the client saw it (all durations in ms)."""

    client: int
    t_done: float
    rtt_ms: float
    encode_ms: float
    inference_ms: float
    queue_wait_ms: float
    ok: bool


@dataclass
class FleetResult:
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    window_s: float = 0.0


def _frames(height: int, width: int, seed: int) -> dict[str, np.ndarray]:
    # Smooth content (gradients + a little noise) compresses like a camera frame, not like noise.
    rng = np.random.default_rng(seed)
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :]
    frames = {}
    for i, name in enumerate(("front", "wrist")):
        r, g, b = (y + x * (i + 1)) % 256, (x * 0.5 + y * 0 + seed) % 256, (y * 0.7 + x * 0) % 256
        base = np.stack([r, g, b], axis=-1)
        noise = rng.normal(0, 4, size=base.shape)
        frames[name] = np.clip(base + noise, 0, 255).astype(np.uint8)
    return frames


async def run_fleet(
    port: int,
    n_clients: int,
    *,
    quality: int,
    warmup_s: float,
    measure_s: float,
    max_requests: int | None = None,
    height: int = 480,
    width: int = 640,
) -> FleetResult:
    """N clients, each one request in flight; samples completed inside the measurement window.

    Every client opens its own Zenoh session (one robot = one session = one link, as deployed).
    With ``max_requests`` each client stops after that many requests (smoke mode).
    """
    from servo.client import ObservationInput, PolicyClient
    from servo.transport import ZenohSettings

    settings = ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{port}"])
    result = FleetResult()
    window: list[float] = []
    started = anyio.Event()
    ready = 0

    async def one(index: int) -> None:
        nonlocal ready
        async with PolicyClient.connect(settings, f"bench-{index}", jpeg_quality=quality) as client:
            servers = await client.discover(app="bench")
            session = await client.open_session(servers[0], features=servers[0].status.policy.features, fps=FPS)
            frames = _frames(height, width, index)
            state = np.full(len(JOINTS), float(index), dtype=np.float32)
            ready += 1
            if ready == n_clients:
                started.set()
            await started.wait()
            sent = 0
            try:
                while max_requests is None or sent < max_requests:
                    if window and time.monotonic() >= window[1]:
                        break
                    state[0] = float(sent)
                    obs = ObservationInput(state, frames, time.monotonic_ns())
                    try:
                        chunk = await session.infer(obs, timeout=5.0)
                    except Exception as exc:  # recorded, judged by the caller
                        result.errors.append(f"client {index}: {type(exc).__name__}: {exc}")
                        continue
                    finally:
                        sent += 1
                    now = time.monotonic()
                    ok = chunk.chunk_robot.shape == (CHUNK, len(JOINTS)) and bool(
                        np.array_equal(chunk.chunk_robot[0], state)
                    )
                    if not window or window[0] <= now <= window[1]:
                        result.samples.append(
                            Sample(
                                index,
                                now,
                                chunk.rtt_ns / 1e6,
                                session.stats.encode_ms[-1],
                                chunk.inference_ms,
                                chunk.queue_wait_ms,
                                ok,
                            )
                        )
                    session.stats.encode_ms.clear()
            finally:
                await session.close()

    async with anyio.create_task_group() as tg:
        for i in range(n_clients):
            tg.start_soon(one, i)
        await started.wait()
        if max_requests is None:
            t0 = time.monotonic() + warmup_s
            window.extend([t0, t0 + measure_s])
            result.window_s = measure_s
    if max_requests is not None:
        times = [s.t_done for s in result.samples]
        result.window_s = (max(times) - min(times)) if len(times) > 1 else 0.0
    return result


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve_main(sys.argv[2:])
    else:
        sys.exit("usage: _fleet.py serve --port P [--compute-ms 20]")
