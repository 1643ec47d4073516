"""A fleet of servo clients against a policy server in another process (bench_server.py).

Server side (``python -m benches._fleet serve --port P``): a `PolicyServer` whose policy computes
for exactly ``--compute-ms`` per forward — a sleep (releases the GIL like a GPU forward) topped
up with GIL-releasing yields, so every forward takes the same time and "ideal" is well defined.
It prints ``READY`` on stdout once it serves; SIGTERM drains it.

The same-run baseline (bare Zenoh, the transport floor) is `benches._floor`.

Client side: `run_fleet` runs N clients in the caller's event loop, each with
its own Zenoh session (one robot = one session = one link), each sending as fast as one
request in flight allows, and return per-request samples. `run_process_fleet` runs each client
in its own process (``python -m benches._fleet client``), as robots are.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import astuple, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import anyio
import numpy as np

from servo.policy import DecodedObservation, PolicySpec, Prepared
from servo.wire import CameraFeature, Features

if TYPE_CHECKING:
    from servo.client.codec import CodecStatus

JOINTS = ("j0", "j1", "j2", "j3", "j4", "j5")
CHUNK = 50
FPS = 30.0
HEIGHT, WIDTH = 480, 640
CAMERAS = ("front", "wrist")
#: Client processes start this far apart: 16 raw observations put at the same instant are a
#: 30 MB burst that congestion control DROP thins out (issue 10 item 1), not a scheduling test.
START_STAGGER_S = 0.025


def exact_wait(seconds: float) -> None:
    """Wait ``seconds`` without holding the GIL: sleep most of it, then yield until the deadline
    (``time.sleep`` alone overshoots by 0.1-0.2 ms on a VM)."""
    deadline = time.perf_counter() + seconds
    if seconds > 0.0005:
        time.sleep(seconds - 0.0004)
    while time.perf_counter() < deadline:
        time.sleep(0)


class _Relative:
    """Per-session processor: the chunk is relative to the state seen at preprocess."""

    def __init__(self, cameras: dict[str, CameraFeature]) -> None:
        self._cameras = cameras
        self._state: np.ndarray | None = None

    def preprocess(self, obs: DecodedObservation) -> Prepared:
        for name, cam in self._cameras.items():
            if obs.images[name].shape != (cam.height, cam.width, 3):
                raise ValueError(f"camera {name}: {obs.images[name].shape}")
        self._state = np.array(obs.state, dtype=np.float32)
        return Prepared(batch=None, prefix=None)

    def postprocess(self, chunk: np.ndarray) -> np.ndarray:
        assert self._state is not None
        return chunk + self._state

    def reset(self) -> None:
        self._state = None


class FixedComputePolicy:
    """Chunk-stateless policy whose forward takes exactly ``compute_ms``.

    The model-space chunk is ``0, 0.001, 0.002, …`` per step, so ``chunk_robot[0] == state``: a
    client can check that every chunk was computed from its own observation.
    """

    def __init__(self, compute_ms: float = 20.0, height: int = HEIGHT, width: int = WIDTH) -> None:
        self.compute_s = compute_ms / 1e3
        self._cameras = {name: CameraFeature(height, width) for name in CAMERAS}
        self._spec = PolicySpec(
            model="bench/fixed",
            revision="v1",
            features=Features(state_names=list(JOINTS), action_names=list(JOINTS), cameras=self._cameras),
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
        exact_wait(self.compute_s)
        return self._chunk

    def reset(self) -> None:
        pass


class CostModelPolicy(FixedComputePolicy):
    """A batch-friendly `FixedComputePolicy`: a forward of ``b`` observations takes exactly
    ``base_ms + per_sample_ms * b`` (a GPU's fixed launch and weight-read cost plus a small
    per-sample cost), alone or through ``predict_chunk_batch``."""

    def __init__(self, base_ms: float, per_sample_ms: float, height: int = HEIGHT, width: int = WIDTH) -> None:
        super().__init__(base_ms + per_sample_ms, height, width)
        self.base_s, self.per_sample_s = base_ms / 1e3, per_sample_ms / 1e3

    def predict_chunk_batch(self, batches: Sequence[Any], inference_delays: Sequence[int], prefixes: Any) -> np.ndarray:
        exact_wait(self.base_s + self.per_sample_s * len(batches))
        return np.stack([self._chunk] * len(batches))


# ---------------------------------------------------------------------------- server processes
@contextlib.contextmanager
def spawn_server(role: str, *args: str, module: str = "benches._fleet") -> Iterator[int]:
    """Run ``python -m <module> <role> --port P <args>`` until the block exits; yields P."""
    from benches._support import ready_process
    from testbed.processes import free_port

    port = free_port()
    with ready_process([sys.executable, "-m", module, role, "--port", str(port), *args], f"{role} server"):
        yield port


def manifest_text(
    port: int,
    *,
    max_sessions: int = 32,
    shared_memory: bool = True,
    host: str = "127.0.0.1",
    max_batch: int = 16,
    model: str = 'source = "bench"\nwarmup = 2',
    intake_threads: int = 0,
) -> str:
    """A bench server's manifest; ``model`` is the body of its ``[model]`` table."""
    return f"""
[model]
{model}
[serving]
app = "bench"
max_sessions = {max_sessions}
max_batch = {max_batch}
intake_threads = {intake_threads}
client_grace_s = 2.0
[zenoh]
listen = ["tcp/{host}:{port}"]
shared_memory = {str(shared_memory).lower()}
[ops]
health_port = 0
[security]
# Off loopback only on the benches' private veth link (bench_link): plain TCP and robots that did not
# enrol (the bench's clients are made per run) are said explicitly.
insecure = {str(host != "127.0.0.1").lower()}
allow_any_robot = {str(host != "127.0.0.1").lower()}
"""


async def _serve(args: argparse.Namespace) -> None:
    from servo.cli.lifecycle import on_signal
    from servo.server.manifest import parse_manifest
    from servo.server.service import PolicyServer

    policy: Any = None
    model = 'source = "bench"\nwarmup = 2'
    if args.source == "fixed" and args.process == "separate":  # built by the policy process
        model = "\n".join(
            [
                'source = "benches._fleet:FixedComputePolicy"',
                "warmup = 2",
                "[model.options]",
                f"compute_ms = {args.compute_ms}",
                f"height = {args.height}",
                f"width = {args.width}",
            ]
        )
    elif args.source == "fixed":
        policy = (
            CostModelPolicy(args.compute_ms, args.per_sample_ms, args.height, args.width)
            if args.per_sample_ms
            else FixedComputePolicy(args.compute_ms, args.height, args.width)
        )
    else:  # a real policy loaded from the manifest, on the device asked for (benches.gpu_check)
        model = "\n".join(
            [
                f'source = "{args.source}"',
                "warmup = 3",
                f'device = "{args.device}"',
                f'dtype = "{args.dtype}"',
                f'frames = "{args.frames}"',
                f"cuda_graphs = {str(args.cuda_graphs).lower()}",
                "[model.options]",
                args.options,
            ]
        )
    text = manifest_text(
        args.port,
        shared_memory=args.transport == "shm",
        host=args.host,
        max_batch=args.max_batch,
        model=model,
        intake_threads=args.intake_threads,
    )
    server = PolicyServer(parse_manifest(text), policy=policy)
    async with anyio.create_task_group() as tg:

        async def run_server(*, task_status: Any) -> None:
            await server.run(task_status=task_status)
            tg.cancel_scope.cancel()

        tg.start_soon(
            lambda: on_signal(
                server.drain, server.hurry, say=lambda text: print(text, file=sys.stderr), what="stopping"
            )
        )
        ready = await tg.start(run_server)
        print("READY", json.dumps(ready.paths, separators=(",", ":")), flush=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benches._fleet")
    parser.add_argument("role", choices=("serve", "client"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1", help="Address to listen on (serve)")
    parser.add_argument("--compute-ms", type=float, default=20.0, help="forward time (the base time with a cost model)")
    parser.add_argument("--per-sample-ms", type=float, default=0.0, help="> 0: CostModelPolicy, batch-friendly")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--intake-threads", type=int, default=0, help="serve: serving.intake_threads (0: per core)")
    parser.add_argument("--index", type=int, default=0, help="client: its index (client id, state, frames)")
    parser.add_argument("--quality", type=int, default=0, help="client: JPEG quality, 0 = raw")
    parser.add_argument("--height", type=int, default=HEIGHT)
    parser.add_argument("--width", type=int, default=WIDTH)
    parser.add_argument("--transport", choices=("tcp", "shm"), default="tcp", help="shm: Zenoh shared memory")
    parser.add_argument(
        "--process",
        choices=("inline", "separate"),
        default="inline",
        help="serve --source fixed: the policy in this process, or in a policy process (model.process)",
    )
    parser.add_argument("--source", default="fixed", help="serve: fixed (FixedComputePolicy) or a model.source")
    parser.add_argument("--options", default="", help="serve: body of [model.options] for --source")
    parser.add_argument("--device", default="cpu", help="serve: model.device for --source")
    parser.add_argument("--dtype", default="float32", help="serve: model.dtype for --source")
    parser.add_argument("--frames", default="auto", help="serve: model.frames for --source")
    parser.add_argument("--cuda-graphs", action="store_true", help="serve: model.cuda_graphs for --source")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    from servo.logs import configure_logging

    configure_logging(args.log_level)
    if args.role == "serve":
        anyio.run(_serve, args, backend="asyncio", backend_options={"use_uvloop": True})
    else:
        anyio.run(_client_process, args, backend="asyncio", backend_options={"use_uvloop": True})


# ---------------------------------------------------------------------------- client side
@dataclass
class Sample:
    """One served request as its client saw it (durations in ms, ``t_done`` monotonic s)."""

    client: int
    t_done: float
    rtt_ms: float
    encode_ms: float
    inference_ms: float
    queue_wait_ms: float
    ok: bool
    #: Wall clock around the caller's ``await session.infer(...)``: what the caller sees (``rtt_ms``
    #: is stamped on Zenoh's callback thread, before the hand-off to the caller).
    await_ms: float = float("nan")


@dataclass
class FleetResult:
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    n_clients: int = 0
    window_s: float = 0.0
    codec: list[CodecStatus] = field(default_factory=list)


def frames(height: int, width: int, seed: int) -> dict[str, np.ndarray]:
    """Camera-like RGB frames: smooth gradients plus sensor noise (JPEG-compresses like a camera
    image, ~55 kB at q90 for 480x640, unlike pure noise)."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None] * np.ones((1, width), np.float32)
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :] * np.ones((height, 1), np.float32)
    out = {}
    for i, name in enumerate(CAMERAS):
        base = np.stack([(y + x * (i + 1)) % 256, (x * 0.5 + seed) % 256, (y * 0.7) % 256], axis=-1)
        out[name] = np.clip(base + rng.normal(0, 4, size=base.shape), 0, 255).astype(np.uint8)
    return out


def window(smoke: bool, *, smoke_requests: int, warmup_s: float, measure_s: float) -> dict[str, Any]:
    """`run_fleet` / `run_process_fleet` keywords: ``smoke_requests`` per client and no window in
    a smoke run, else ``measure_s`` after ``warmup_s``."""
    if smoke:
        return {"warmup_s": 0.0, "measure_s": None, "max_requests": smoke_requests}
    return {"warmup_s": warmup_s, "measure_s": measure_s}


class Clock:
    """Shared start line and measurement window of one run (event loop only)."""

    def __init__(self, n_clients: int, warmup_s: float, measure_s: float | None) -> None:
        self.n_clients = n_clients
        self.ready = 0
        self.go = anyio.Event()
        self.warmup_s, self.measure_s = warmup_s, measure_s
        self.start = self.end = 0.0

    def arrived(self) -> None:
        self.ready += 1
        if self.ready == self.n_clients:
            now = time.monotonic()
            self.start = now + self.warmup_s
            self.end = self.start + self.measure_s if self.measure_s is not None else float("inf")
            self.go.set()

    def measuring(self, now: float) -> bool:
        return self.start <= now <= self.end


async def run_fleet(
    port: int,
    n_clients: int,
    *,
    quality: int | Literal["auto"],
    warmup_s: float,
    measure_s: float | None,
    max_requests: int | None = None,
    height: int = HEIGHT,
    width: int = WIDTH,
    transport: str = "tcp",
    host: str = "127.0.0.1",
) -> FleetResult:
    """N servo clients against the server on ``host``:``port``; samples completed inside the window
    (``measure_s=None``: every request, each client stopping after ``max_requests``). ``codec``
    of the result holds each client's codec status at the end."""
    from servo.client import PolicyClient
    from servo.transport import ZenohSettings

    settings = ZenohSettings(mode="client", connect=[f"tcp/{host}:{port}"], shared_memory=transport == "shm")
    result = FleetResult(n_clients=n_clients, window_s=measure_s or 0.0)
    clock = Clock(n_clients, warmup_s, measure_s)

    async def one(index: int) -> None:
        async with PolicyClient.connect(settings, f"bench-{index}", jpeg_quality=quality) as client:
            (server, *_) = await client.discover(app="bench")
            session = await client.open_session(server, features=server.status.policy.features, fps=FPS)
            # Built before the start line: N clients share this loop, and frames built after it
            # (~60 ms each under load) held every chunk arriving meanwhile on the loop's queue.
            images = frames(height, width, index)
            clock.arrived()
            await clock.go.wait()
            try:
                await _drive(session, index, clock, result, max_requests, images)
            finally:
                result.codec.append(session.codec_status())
                await session.close()

    async with anyio.create_task_group() as tg:
        for i in range(n_clients):
            tg.start_soon(one, i)
    return result


async def _drive(
    session: Any, index: int, clock: Clock, result: FleetResult, max_requests: int | None, images: dict[str, Any]
) -> None:
    """One client's requests, one in flight, until the window closes; samples inside it."""
    state = np.full(len(JOINTS), float(index), dtype=np.float32)
    sent = 0
    while (max_requests is None or sent < max_requests) and time.monotonic() < clock.end:
        state[0] = float(sent)
        sent += 1
        called = time.monotonic_ns()
        try:
            chunk = await session.infer(state, images, timeout=5)
        except Exception as exc:  # recorded; the benchmark's correctness flag fails
            result.errors.append(f"client {index}: {type(exc).__name__}: {exc}")
            if len(result.errors) > 20:
                raise
            continue
        returned = time.monotonic_ns()
        now = returned / 1e9
        encode_ms = session.stats.last_encode_ms
        if clock.measure_s is None or clock.measuring(now):
            ok = chunk.chunk_robot.shape == (CHUNK, len(JOINTS)) and bool(np.array_equal(chunk.chunk_robot[0], state))
            result.samples.append(
                Sample(
                    index,
                    now,
                    chunk.rtt_ns / 1e6,
                    encode_ms,
                    chunk.inference_ms,
                    chunk.queue_wait_ms,
                    ok,
                    (returned - called) / 1e6,
                )
            )


async def _client_process(args: argparse.Namespace) -> None:
    """One client in its own process: ``READY`` once its session is open, then on stdin
    ``GO <start_at> <measure_from> <measure_s|-> <max_requests|->`` (instants on the machine's
    shared monotonic clock); prints its samples and errors as one JSON line when done."""
    from servo.client import PolicyClient
    from servo.transport import ZenohSettings

    settings = ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{args.port}"], shared_memory=False)
    result = FleetResult(n_clients=1)
    async with PolicyClient.connect(settings, f"bench-{args.index}", jpeg_quality=args.quality) as client:
        (server, *_) = await client.discover(app="bench")
        session = await client.open_session(server, features=server.status.policy.features, fps=FPS)
        images = frames(args.height, args.width, args.index)  # before the start line, like run_fleet
        print("READY", flush=True)
        _, start_at, measure_from, measure, limit = (await anyio.to_thread.run_sync(sys.stdin.readline)).split()
        clock = Clock(1, 0.0, None if measure == "-" else float(measure))
        clock.start = float(measure_from)
        clock.end = clock.start + clock.measure_s if clock.measure_s is not None else float("inf")
        await anyio.sleep(max(0.0, float(start_at) - time.monotonic()))
        try:
            await _drive(session, args.index, clock, result, None if limit == "-" else int(limit), images)
        finally:
            await session.close()
    print(json.dumps({"samples": [astuple(x) for x in result.samples], "errors": result.errors}), flush=True)


def run_process_fleet(
    port: int,
    n_clients: int,
    *,
    quality: int,
    warmup_s: float,
    measure_s: float | None,
    max_requests: int | None = None,
    height: int = HEIGHT,
    width: int = WIDTH,
    deadline_s: float = 180.0,
    client: str = "benches._fleet",
    on_window: Callable[[float, float], None] | None = None,
) -> FleetResult:
    """Like `run_fleet`, with every client in its own process (``python -m benches._fleet client``);
    client ``i`` starts ``i * START_STAGGER_S`` after the first, all inside the warm-up. Clients
    still running ``deadline_s`` after the start are killed (the run then fails, never hangs).

    ``client`` names another module whose ``client`` role speaks the same lines (READY, GO, one
    JSON line of samples); ``on_window(start, end)`` is told the window's monotonic instants once
    every client has its start line (``end`` is infinite without a window).
    """
    from benches._support import REPO, bench_env

    base = [sys.executable, "-m", client, "client", "--port", str(port), "--quality", str(quality)]
    size = ["--height", str(height), "--width", str(width)]
    procs = [
        subprocess.Popen(
            [*base, *size, "--index", str(i)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=bench_env(),
        )
        for i in range(n_clients)
    ]
    result = FleetResult(n_clients=n_clients, window_s=measure_s or 0.0)
    timer = threading.Timer(deadline_s, lambda: [p.kill() for p in procs])  # a stuck client must not hang the run
    timer.start()
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == "READY", f"client process did not start (exit {proc.poll()})"
        t0 = time.monotonic() + 0.2
        rest = f"{t0 + warmup_s} {'-' if measure_s is None else measure_s} {max_requests or '-'}"
        for i, proc in enumerate(procs):
            assert proc.stdin is not None
            proc.stdin.write(f"GO {t0 + i * START_STAGGER_S} {rest}\n")
            proc.stdin.flush()
        if on_window is not None:
            on_window(t0 + warmup_s, t0 + warmup_s + measure_s if measure_s is not None else float("inf"))
        for proc in procs:
            out, _ = proc.communicate()
            assert proc.returncode == 0, f"client process exited with {proc.returncode}"
            got = json.loads(out.strip().splitlines()[-1])
            result.samples += [Sample(*x) for x in got["samples"]]
            result.errors += got["errors"]
    finally:
        timer.cancel()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
