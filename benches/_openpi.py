"""Servers for bench_openpi.py, each in its own process: ``python -m benches._openpi servo|baseline``.

- ``servo``: a `PolicyServer` with the openpi front door (``[frontends.openpi]``) serving
  `benches._fleet.FixedComputePolicy` (two 480x640 cameras, 50x6 chunk, exactly 20 ms forward).
- ``baseline``: a minimal openpi-protocol server written for this benchmark from openpi's
  protocol (not openpi's code, which is not on PyPI): ``websockets`` asyncio server, metadata
  frame on connect, ``openpi_client.msgpack_numpy`` in and out, the forward run in the
  connection handler on the event loop as openpi's ``WebsocketPolicyServer`` does, and the same
  mock policy (the same wait, ``state + 0.001 * step`` in every column).

Each prints ``READY <port>`` on stdout once it serves and stops on SIGTERM.

``python -m benches._openpi client --port P --index I``: one openpi client (openpi's own
``WebsocketClientPolicy`` from PyPI) in its own process, speaking `benches._fleet.run_process_fleet`'s
lines (READY, GO, one JSON line of samples): the same payload as servo's fleet clients, raw.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from dataclasses import astuple
from typing import Any

import anyio
import numpy as np

from benches._fleet import CHUNK, HEIGHT, JOINTS, WIDTH, FixedComputePolicy, exact_wait


async def _servo(compute_ms: float) -> None:
    from servo.cli.lifecycle import on_signal
    from servo.frontends import frontends_of
    from servo.server.manifest import parse_manifest
    from servo.server.service import PolicyServer, ServerReady

    manifest = parse_manifest(
        """
[model]
source = "bench"
warmup = 2
[zenoh]
listen = ["tcp/127.0.0.1:0"]
[ops]
health_port = 0
[frontends.openpi]
listen = "127.0.0.1:0"
"""
    )
    server = PolicyServer(manifest, policy=FixedComputePolicy(compute_ms), frontends=frontends_of(manifest))
    async with anyio.create_task_group() as tg:

        async def run_server(*, task_status: Any) -> None:
            await server.run(task_status=task_status)
            tg.cancel_scope.cancel()

        tg.start_soon(lambda: on_signal(server.drain, server.hurry, say=print, what="stopping"))
        ready: ServerReady = await tg.start(run_server)
        print("READY", ready.frontends["openpi"].rsplit(":", 1)[1], flush=True)


async def _baseline(compute_ms: float) -> None:
    from openpi_client import msgpack_numpy
    from websockets.asyncio.server import ServerConnection, serve
    from websockets.exceptions import ConnectionClosed

    steps = np.arange(CHUNK, dtype=np.float32)[:, None] * np.float32(0.001)

    def infer(obs: dict[str, Any]) -> dict[str, Any]:
        state = np.asarray(obs["state"], dtype=np.float32)
        exact_wait(compute_ms / 1e3)
        return {"actions": steps + state}

    async def handler(ws: ServerConnection) -> None:
        await ws.send(msgpack_numpy.packb({"model": "bench/fixed", "action_dim": len(JOINTS)}))
        while True:
            try:
                obs = msgpack_numpy.unpackb(await ws.recv())
            except ConnectionClosed:
                return
            started = time.monotonic()
            reply = infer(obs)  # on the loop, as openpi's server does
            infer_ms = (time.monotonic() - started) * 1e3
            reply["server_timing"] = {"infer_ms": infer_ms}
            reply["policy_timing"] = {"infer_ms": infer_ms}
            await ws.send(msgpack_numpy.packb(reply))

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as server:
        print("READY", server.sockets[0].getsockname()[1], flush=True)
        await stop.wait()


def _client(args: argparse.Namespace) -> None:
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from benches._fleet import Sample, frames

    images = frames(args.height, args.width, args.index)
    policy = WebsocketClientPolicy("127.0.0.1", args.port)
    samples: list[Sample] = []
    errors: list[str] = []
    print("READY", flush=True)
    _, start_at, measure_from, measure, limit = sys.stdin.readline().split()
    start = float(measure_from)
    end = start + float(measure) if measure != "-" else float("inf")
    time.sleep(max(0.0, float(start_at) - time.monotonic()))
    sent = 0
    try:
        while (limit == "-" or sent < int(limit)) and time.monotonic() < end:
            state = np.full(len(JOINTS), float(args.index * 1000 + sent), dtype=np.float32)
            called = time.monotonic_ns()
            try:
                reply = policy.infer({"state": state, "images": images, "prompt": "pick up the cube"})
            except Exception as exc:  # recorded; the benchmark's correctness flag fails
                errors.append(f"client {args.index}: {type(exc).__name__}: {exc}")
                break
            returned = time.monotonic_ns()
            sent += 1
            if measure == "-" or start <= returned / 1e9:
                ok = reply["actions"].shape == (CHUNK, len(JOINTS)) and bool(np.allclose(reply["actions"][0], state))
                infer_ms = float(reply["policy_timing"]["infer_ms"])
                rtt_ms = (returned - called) / 1e6
                samples.append(Sample(args.index, returned / 1e9, rtt_ms, 0.0, infer_ms, 0.0, ok, rtt_ms))
    finally:
        policy._ws.close()
    print(json.dumps({"samples": [astuple(x) for x in samples], "errors": errors}), flush=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benches._openpi")
    parser.add_argument("role", choices=["servo", "baseline", "client"])
    parser.add_argument("--compute-ms", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=0, help="client: the server's port")
    parser.add_argument("--index", type=int, default=0, help="client: its index (state, frames)")
    parser.add_argument("--quality", type=int, default=0, help="client: 0 (openpi sends frames raw)")
    parser.add_argument("--height", type=int, default=HEIGHT)
    parser.add_argument("--width", type=int, default=WIDTH)
    args = parser.parse_args(argv)
    if args.role == "client":
        _client(args)
        return
    run = _servo if args.role == "servo" else _baseline
    anyio.run(run, args.compute_ms, backend="asyncio", backend_options={"use_uvloop": True})


if __name__ == "__main__":
    main(sys.argv[1:])
