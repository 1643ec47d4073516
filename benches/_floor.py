"""The transport floor of bench_server.py: bare Zenoh with the same payload and compute, no servo code.

Server (``python -m benches._floor echo --port P --compute-ms T --transport tcp|shm``): the subscriber
hands each sample, stamped, to one worker thread (one device, as servo's server has) that copies
it out of Zenoh, decrypts it when the attachment is a session one, waits the compute time and
publishes a reply of the chunk's size whose first 8 bytes are how long the sample waited for the
worker (ns, little-endian): at N > 1 the floor's queue wait is subtracted like servo's. It prints
``READY`` once it serves; SIGTERM ends it.

Clients:

* `run_floor`: the floor itself: N plain threads, each with its own Zenoh session, putting a
  pre-encoded raw observation (encrypted or not) and waiting on a `threading.Event`: no event loop,
  no encode. Two figures per request: ``rtt_ms`` stamped in the reply callback (as servo's
  ``ChunkResult.rtt_ns``) and ``await_ms`` when the waiting thread got it back (what a caller sees).
* `run_echo_fleet`: the same echo driven from an event loop, encoding each observation as
  servo's client does (its encoder threads, then `servo.wire.encode`).
"""

from __future__ import annotations

import argparse
import queue
import signal
import struct
import sys
import threading
import time
from typing import Any

import anyio
import numpy as np

from benches._fleet import (
    CHUNK,
    HEIGHT,
    JOINTS,
    START_STAGGER_S,
    WIDTH,
    Clock,
    FleetResult,
    Sample,
    exact_wait,
    frames,
)
from servo._core import ATTACHMENT_SIZE, MSG_OBS, SCHEMA_VERSION, Header, SessionKey

#: The session secret of `run_floor`'s encrypted observations (the echo server decrypts them with it).
FLOOR_SECRET = bytes(range(32))
#: The reply's queue-wait field (ns the sample waited for the worker).
WAIT = struct.Struct("<q")


def obs_key(index: int) -> str:
    return f"bench/echo/{index}/obs"


def _serve(args: argparse.Namespace) -> None:
    import zenoh

    from servo.transport import ZenohSettings

    settings = ZenohSettings(listen=[f"tcp/127.0.0.1:{args.port}"], shared_memory=args.transport == "shm")
    filler = b"\x00" * (2 * CHUNK * len(JOINTS) * 4 + 64 - WAIT.size)
    jobs: queue.SimpleQueue[tuple[int, Any] | None] = queue.SimpleQueue()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server_key = SessionKey(FLOOR_SECRET, role="server")
    with zenoh.open(settings.to_config()) as session:
        publishers: dict[str, Any] = {}

        def work() -> None:
            while (job := jobs.get()) is not None:
                arrived_ns, sample = job
                waited_ns = time.monotonic_ns() - arrived_ns
                body = sample.payload.to_bytes()  # what any server must do to read the payload
                attachment = b"" if sample.attachment is None else sample.attachment.to_bytes()
                if len(attachment) == ATTACHMENT_SIZE:
                    server_key.decrypt(attachment, body)  # servo's server-side cipher pass
                exact_wait(args.compute_ms / 1e3)
                key = str(sample.key_expr).rsplit("/", 1)[0] + "/action"
                if key not in publishers:
                    publishers[key] = session.declare_publisher(
                        key,
                        congestion_control=zenoh.CongestionControl.DROP,
                        priority=zenoh.Priority.INTERACTIVE_HIGH,
                        express=True,
                    )
                publishers[key].put(WAIT.pack(waited_ns) + filler, attachment=sample.attachment)

        worker = threading.Thread(target=work)
        worker.start()
        sub = session.declare_subscriber("bench/echo/*/obs", lambda s: jobs.put((time.monotonic_ns(), s)))
        print("READY", flush=True)
        while not stop.wait(0.5):
            pass
        sub.undeclare()
        jobs.put(None)
        worker.join()


def run_floor(
    port: int,
    *,
    cipher: bool,
    warmup_s: float,
    measure_s: float | None,
    max_requests: int | None = None,
    compute_ms: float = 20.0,
    n_clients: int = 1,
    transport: str = "tcp",
) -> FleetResult:
    """The transport floor: N plain threads, each its own Zenoh session, raw frames.

    The observation (two raw frames, as servo encodes them) is encoded once; each request only
    encrypts it when ``cipher`` (AES-256-GCM over the 1.84 MB body, as servo's client does; the
    echo server then decrypts it, as servo's server does) and puts it. ``rtt_ms`` = put called -> reply
    callback; ``await_ms`` = put called -> the waiting thread has the reply; the queue wait is the
    server's. What servo adds is its encode, its event loop and its bookkeeping.
    """
    import zenoh

    from servo.transport import ZenohSettings
    from servo.wire import Observation, encode, encode_tensor
    from servo.wire.image import encode_image

    settings = ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{port}"], shared_memory=transport == "shm")
    result = FleetResult(n_clients=n_clients, window_s=measure_s or 0.0)
    images = {name: encode_image(frame, 0) for name, frame in frames(HEIGHT, WIDTH, 0).items()}
    body = encode(Observation(state=encode_tensor(np.zeros(len(JOINTS), np.float32)), images=images))
    start_at: list[float] = []  # when the window opens, set once every client is connected
    ready = threading.Barrier(n_clients, action=lambda: start_at.append(time.monotonic() + warmup_s))
    lock = threading.Lock()

    def client(index: int) -> None:
        arrived, matched = threading.Event(), threading.Event()
        replies: list[tuple[int, int]] = []
        with zenoh.open(settings.to_config()) as z:

            def on_reply(sample: zenoh.Sample) -> None:
                stamp = time.monotonic_ns()
                replies.append((stamp, WAIT.unpack(sample.payload.to_bytes()[: WAIT.size])[0]))
                arrived.set()

            sub = z.declare_subscriber(f"bench/echo/{index}/action", on_reply)
            pub = z.declare_publisher(obs_key(index), congestion_control=zenoh.CongestionControl.BLOCK)
            listener = pub.declare_matching_listener(lambda status: status.matching and matched.set())
            try:
                if not matched.wait(10):
                    raise TimeoutError("the echo server never subscribed")
                ready.wait(60)
                start = start_at[0]
                end = start + measure_s if measure_s is not None else float("inf")
                time.sleep(index * START_STAGGER_S)  # 16 raw observations at one instant: a burst DROP thins
                seq = 0
                client_key = SessionKey(FLOOR_SECRET, role="client")
                while (max_requests is None or seq < max_requests) and time.monotonic() < end:
                    seq += 1
                    arrived.clear()
                    t0 = time.monotonic_ns()
                    attachment, payload = b"x" * 30, body
                    if cipher:
                        header = Header(SCHEMA_VERSION, MSG_OBS, 0, seq, 0, 0, t0, bytes(16))
                        attachment, payload = client_key.encrypt(header, body)
                    pub.put(payload, attachment=attachment)
                    got = arrived.wait(5)
                    t1 = time.monotonic_ns()
                    with lock:
                        if not got:
                            result.errors.append(f"RequestTimeout: client {index} seq {seq}")
                            continue
                        now = t1 / 1e9
                        if measure_s is None or start <= now:
                            stamp, waited_ns = replies[-1]
                            rtt_ms, await_ms = (stamp - t0) / 1e6, (t1 - t0) / 1e6
                            result.samples.append(
                                Sample(index, now, rtt_ms, 0.0, compute_ms, waited_ns / 1e6, True, await_ms)
                            )
            finally:
                listener.undeclare()
                pub.undeclare()
                sub.undeclare()

    def guarded(index: int) -> None:
        try:
            client(index)
        except Exception as exc:  # recorded (the row then fails); the others must not wait for it
            ready.abort()
            with lock:
                result.errors.append(f"client {index}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=guarded, args=(i,), daemon=True) for i in range(n_clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join((measure_s or 60) + warmup_s + 60)
    return result


async def run_echo_fleet(
    port: int,
    n_clients: int,
    *,
    quality: int,
    warmup_s: float,
    measure_s: float | None,
    max_requests: int | None = None,
    compute_ms: float = 20.0,
    transport: str = "tcp",
) -> FleetResult:
    """The echo from an event loop: the same payload (an observation encoded as servo's client
    encodes it) through bare Zenoh and back; ``inference_ms`` is the echo's fixed compute time."""
    import zenoh

    from servo.client.encoder import FrameEncoder
    from servo.stages import LoopBridge
    from servo.transport import ZenohSettings, open_zsession
    from servo.wire import Observation, encode, encode_tensor

    settings = ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{port}"], shared_memory=transport == "shm")
    result = FleetResult(n_clients=n_clients, window_s=measure_s or 0.0)
    clock = Clock(n_clients, warmup_s, measure_s)

    async def one(index: int) -> None:
        async with open_zsession(settings) as z:
            bridge = LoopBridge()
            arrived = anyio.Event()
            replies: list[tuple[int, int]] = []

            def on_reply(stamp: int, waited_ns: int) -> None:
                replies.append((stamp, waited_ns))
                arrived.set()

            def on_sample(sample: zenoh.Sample) -> None:
                waited_ns = WAIT.unpack(sample.payload.to_bytes()[: WAIT.size])[0]
                bridge.call(on_reply, time.monotonic_ns(), waited_ns)

            sub = z.declare_subscriber(f"bench/echo/{index}/action", on_sample)
            pub = z.declare_publisher(obs_key(index), congestion_control=zenoh.CongestionControl.DROP)
            matched = anyio.Event()
            listener = pub.declare_matching_listener(lambda st: st.matching and bridge.call(matched.set))
            await matched.wait()
            images = frames(HEIGHT, WIDTH, index)
            state = np.full(len(JOINTS), float(index), dtype=np.float32)
            encoder = FrameEncoder()  # the session's per-camera encoder threads
            clock.arrived()
            await clock.go.wait()
            sent = 0
            try:
                while (max_requests is None or sent < max_requests) and time.monotonic() < clock.end:
                    sent += 1
                    t0 = time.monotonic_ns()
                    encoded = await anyio.to_thread.run_sync(encoder.encode, images, quality)
                    body = encode(Observation(state=encode_tensor(state), images=encoded))
                    encode_ms = (time.monotonic_ns() - t0) / 1e6
                    arrived = anyio.Event()
                    pub.put(body, attachment=b"x" * 30)
                    with anyio.fail_after(5):
                        await arrived.wait()
                    t1 = time.monotonic_ns()
                    if measure_s is None or clock.measuring(t1 / 1e9):
                        stamp, waited_ns = replies[-1]
                        rtt_ms, await_ms = (stamp - t0) / 1e6, (t1 - t0) / 1e6
                        sample = Sample(index, t1 / 1e9, rtt_ms, encode_ms, compute_ms, waited_ns / 1e6, True, await_ms)
                        result.samples.append(sample)
            finally:
                encoder.close()
                bridge.close()
                listener.undeclare()
                pub.undeclare()
                sub.undeclare()

    async with anyio.create_task_group() as tg:
        for i in range(n_clients):
            tg.start_soon(one, i)
    return result


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benches._floor")
    parser.add_argument("role", choices=("echo",))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--compute-ms", type=float, default=20.0)
    parser.add_argument("--transport", choices=("tcp", "shm"), default="tcp", help="shm: Zenoh shared memory")
    _serve(parser.parse_args(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
