"""Processes of the fleet benchmark (bench_scale.py): a router, replicas, and light robots.

* ``python -m benches._scale router --port P`` — a plain Zenoh router (a Python session in router
  mode; servo-router's per-robot access control needs one Zenoh session per robot, and these robots
  share one per process). Prints ``READY``; SIGTERM ends it.
* ``python -m benches._scale serve --router P --replica NAME --compute-ms T`` — a `PolicyServer` of
  `benches._fleet.FixedComputePolicy` (forwards of exactly T ms, one small camera) joining the
  router. Prints ``READY``; SIGTERM drains it.
* ``python -m benches._scale robots --router P --first I --count M --rate R --out FILE`` — M light
  robots sharing one Zenoh client session: each places itself (`PolicyClient.connect_best`), then
  sends one observation every 1/R s (a small JPEG frame, a state unique to the robot and request)
  and checks that the chunk answers exactly that state. A lost session (token gone, drain notice,
  two timeouts in a row) re-places the robot at once, and its new session asks at once (as the
  edge's does). Prints ``CONNECTED`` once every robot has a session; on SIGTERM writes every
  served request (time, replica, fresh?) and every re-placement (when the loss was seen, when the
  dead session was closed, when the new one was open, how many opens were refused meanwhile) as
  JSON and exits, with when the process's Zenoh callback thread saw each replica's liveliness
  token gone, how late its event loop woke from 10 ms sleeps (its own CPU starvation), and the
  process's totals: requests, copies, their expected second answers, timeouts, stale refusals. With
  ``--telemetry-hz H`` each robot also publishes its signed telemetry H times a second, built by
  the edge's own `TelemetryPublisher.record` from its counters, and counts the bytes it put.
* ``python -m benches._scale monitor --router P --port Q`` — ``servo-monitor`` joining the router,
  its page and /metrics on Q. Prints ``READY``; SIGTERM ends it.
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from benches._fleet import FPS, JOINTS, FixedComputePolicy
from servo._core import ServerIdentity

APP = "scale"
#: The bench monitor's identity: the robots encrypt their telemetry to it.
BENCH_MONITOR = ServerIdentity.from_seed(bytes(range(29, 61)))
HEIGHT, WIDTH = 48, 64
#: Sessions a replica accepts: more than the fleet needs, so placement (not refusals) spreads it.
MAX_SESSIONS = 400


def manifest_text(
    router_port: int, listen_port: int, replica: str, health_port: int = 0, robot_metrics: int = 256
) -> str:
    return f"""
[model]
source = "bench"
warmup = 2
[serving]
app = "{APP}"
replica = "{replica}"
max_sessions = {MAX_SESSIONS}
client_grace_s = 2.0
[zenoh]
mode = "peer"
listen = ["tcp/127.0.0.1:{listen_port}"]
connect = ["tcp/127.0.0.1:{router_port}"]
[ops]
health_port = {health_port}
robot_metrics = {robot_metrics}
[security]
listen_beside_router = true
"""


async def _router(args: argparse.Namespace) -> None:
    from servo.transport import ZenohSettings, open_zsession

    async with open_zsession(ZenohSettings(mode="router", listen=[f"tcp/127.0.0.1:{args.port}"])):
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            print("READY", flush=True)
            async for _ in signals:
                break


async def _serve(args: argparse.Namespace) -> None:
    from servo.cli.lifecycle import on_signal
    from servo.server.manifest import parse_manifest
    from servo.server.service import PolicyServer
    from testbed.processes import free_port

    policy = FixedComputePolicy(args.compute_ms, HEIGHT, WIDTH)
    manifest = parse_manifest(
        manifest_text(args.router, free_port(), args.replica, args.health_port, args.robot_metrics)
    )
    server = PolicyServer(manifest, policy=policy)
    async with anyio.create_task_group() as tg:

        async def run_server(*, task_status: Any) -> None:
            await server.run(task_status=task_status)
            tg.cancel_scope.cancel()

        tg.start_soon(lambda: on_signal(server.drain, server.hurry, say=lambda _: None, what="stopping"))
        await tg.start(run_server)
        print("READY", flush=True)


async def _robots(args: argparse.Namespace) -> None:
    from zenoh import Sample, SampleKind

    from benches._fleet import frames
    from servo._core import LatencyTracker
    from servo.client import PolicyClient, RemoteSession, RequestTimeout, ServerError, SessionLost
    from servo.client.errors import NoServerFound, SessionRejected
    from servo.edge.pipeline import DELAY_WINDOW
    from servo.transport import ZenohSettings, open_zsession

    settings = ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{args.router}"])
    period = 1.0 / args.rate
    #: Per robot: (monotonic s, replica, fresh, round trip ms, queue wait ms, inference ms).
    served: dict[int, list[tuple[float, str, bool, float, float, float]]] = {}
    failures: dict[int, int] = {}
    #: Per robot: (monotonic s, bytes put: key + body + attachment) of every telemetry record.
    telemetry: dict[int, list[tuple[float, int]]] = {}
    #: Per robot: (monotonic s the loss was seen, s the dead session was closed, s the next one was
    #: open, opens refused between).
    replaced: dict[int, list[tuple[float, float, float, int]]] = {}
    #: Per robot: monotonic s of every request answered only after it was sent again (`resend`).
    resent: dict[int, list[float]] = {}
    #: Per replica: monotonic s its liveliness token was seen gone, on Zenoh's callback thread.
    gone: dict[str, float] = {}
    #: Over every session of the process: requests asked for, copies made (`RemoteSession.resend`),
    #: second answers of copied requests (expected), requests that timed out, and answers refused
    #: as stale (``stale_seq``) by the clients.
    totals = {"requests": 0, "copies": 0, "copy_answers": 0, "timeouts": 0}
    clients: list[PolicyClient] = []
    #: (monotonic s, ms late) of every 10 ms sleep of this process's event loop.
    lag: list[tuple[float, float]] = []
    connected = 0

    async def loop_lag() -> None:
        while True:
            before = time.monotonic()
            await anyio.sleep(0.01)
            lag.append((before, (time.monotonic() - before - 0.01) * 1e3))

    async def report(index: int, zsession: Any, client: PolicyClient) -> None:
        """The robot's telemetry, as an edge publishes it (`servo.edge.telemetry`)."""
        from zenoh import CongestionControl, Priority

        from servo._core import ServerIdentity
        from servo.edge.engine import EngineStats
        from servo.edge.failsafe import FailSafe, FailSafeConfig
        from servo.edge.telemetry import TelemetryPublisher
        from servo.wire import seal_telemetry, telemetry_key

        publisher = TelemetryPublisher(ServerIdentity.generate(), period_s=1.0 / args.telemetry_hz)
        failsafe = FailSafe(FailSafeConfig(degraded_after_s=1.0, timeout_streak=2, max_offline_s=60.0))
        failsafe.merged()
        key = telemetry_key(f"robot-{index}")
        put = zsession.declare_publisher(key, congestion_control=CongestionControl.DROP, priority=Priority.DATA_LOW)
        lateness = np.zeros(1100, np.uint64)
        sent = telemetry.setdefault(index, [])
        await anyio.sleep(float(np.random.default_rng(index).uniform(0, publisher.period_s)))
        while True:
            rows = served.get(index, [])
            rtts = [r[3] for r in rows[-20:]]
            stats = EngineStats(
                state="streaming", chunks_received=len(rows), chunks_dropped=0, requests=len(rows), timeouts=0,
                errors=0, reconnects=0, fallback_ticks=0, stale_refusals=0, queue_depth=10, delay_steps=1,
                rtt_ms_p50=float(np.median(rtts)) if rtts else None, rtt_ms_p99=max(rtts) if rtts else None,
                replica=rows[-1][1] if rows else "", model="bench",
            )  # fmt: skip
            record = publisher.record(f"robot-{index}", stats, failsafe, lateness, 0)
            body, attachment = seal_telemetry(record, publisher.signer, [BENCH_MONITOR.public_key])
            put.put(body, attachment=attachment)
            sent.append((time.monotonic(), len(key) + len(body) + len(attachment)))
            await anyio.sleep(publisher.period_s)

    async def robot(index: int, zsession: Any) -> None:
        nonlocal connected
        client = PolicyClient(zsession, f"robot-{index}", jpeg_quality=80)
        clients.append(client)
        images = frames(HEIGHT, WIDTH, index)
        state = np.zeros(len(JOINTS), dtype=np.float32)
        state[0] = float(index)
        rows = served.setdefault(index, [])
        recent = LatencyTracker(DELAY_WINDOW)  # round trips: when to ask again, as the edge does
        seq = 0
        # Robots start their cadence at random phases, as independent robots would.
        next_at = time.monotonic() + float(np.random.default_rng(index).uniform(0, period))

        async def stream(session: RemoteSession) -> RemoteSession | None:
            """Serve on ``session`` while placement looks on in the background, as the edge does;
            returns the session it moved to, or None once lost."""
            nonlocal seq, next_at, seen_at
            moved: list[RemoteSession] = []

            async def settle() -> None:
                if (better := await client.rebalance(session, features=features, fps=FPS, app=APP)) is not None:
                    moved.append(better)

            replica, timeouts = session.server.keys.replica, 0
            try:
                async with anyio.create_task_group() as looks:
                    looks.start_soon(settle)
                    while timeouts < 2 and not moved:
                        with anyio.move_on_after(next_at - time.monotonic()):
                            await session.lost.wait()  # a lost session re-places the robot at once
                        if session.lost.is_set():
                            break
                        next_at = max(next_at + period, time.monotonic())
                        seq += 1
                        state[1] = float(seq)
                        copies = session.stats.resent
                        totals["requests"] += 1
                        try:
                            chunk = await session.infer(
                                state,
                                images,
                                timeout=5.0,
                                resend_after=session.resend_after(recent.max()),
                            )
                        except RequestTimeout:
                            timeouts += 1
                            totals["timeouts"] += 1
                            continue
                        except ServerError:
                            continue
                        except SessionLost:  # caught here: out of the task group it is a group
                            break
                        timeouts = 0
                        recent.add(chunk.rtt_ns)
                        if session.stats.resent > copies:
                            resent.setdefault(index, []).append(time.monotonic())
                        fresh = bool(np.array_equal(chunk.chunk_robot[0], state))
                        row = (time.monotonic(), replica, fresh, chunk.rtt_ns / 1e6, chunk.queue_wait_ms)
                        rows.append((*row, chunk.inference_ms))
                    looks.cancel_scope.cancel()
            finally:
                seen_at = time.monotonic()
                totals["copies"] += session.stats.resent
                totals["copy_answers"] += getattr(session.stats, "copy_answers", 0)  # counted since FLAG_COPY
                with anyio.CancelScope(shield=True):
                    await session.close(timeout=0.1)
            if moved:
                next_at = time.monotonic()  # a new session asks at once
                return moved[0]
            return None

        first = True
        lost_at: float | None = None
        seen_at = 0.0
        lost_on: tuple[Any, ...] = ()
        refused = 0
        while True:
            try:
                # As the edge: settled in the background (`stream`), the first request does not wait
                # for the looks, and after a loss the other replicas known are tried without discovery.
                session = await client.connect_best(features=features, fps=FPS, app=APP, settle=False, avoid=lost_on)
            except (NoServerFound, SessionRejected, RequestTimeout):
                failures[index] = failures.get(index, 0) + 1
                refused += 1
                await anyio.sleep(0.1)  # nobody usable: the only case that waits
                continue
            if first:
                first = False
                connected += 1
                if args.telemetry_hz > 0:
                    tg.start_soon(report, index, zsession, client)
                if connected == args.count:
                    print("CONNECTED", flush=True)
            elif lost_at is not None:
                replaced.setdefault(index, []).append((seen_at, lost_at, time.monotonic(), refused))
                next_at = time.monotonic()  # a new session asks at once
            lost_at, refused = None, 0
            current: RemoteSession | None = session
            while current is not None:
                lost_on = (current.server.keys,)
                current = await stream(current)
            lost_at = time.monotonic()

    async with open_zsession(settings) as zsession:
        probe = PolicyClient(zsession, f"probe-{args.first}")
        with anyio.fail_after(60):
            while True:
                try:
                    (server, *others) = await probe.discover(app=APP)
                    break
                except NoServerFound:
                    await anyio.sleep(0.2)
        features = server.status.policy.features

        def watch(replica: str) -> Callable[[Sample], None]:
            def seen(sample: Sample) -> None:
                if sample.kind == SampleKind.DELETE:
                    gone.setdefault(replica, time.monotonic())

            return seen

        alive = [
            zsession.liveliness().declare_subscriber(r.keys.alive, watch(r.keys.replica)) for r in (server, *others)
        ]
        async with anyio.create_task_group() as tg:
            tg.start_soon(loop_lag)
            for i in range(args.first, args.first + args.count):
                tg.start_soon(robot, i, zsession)
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    break
            tg.cancel_scope.cancel()
        for subscriber in alive:
            subscriber.undeclare()
    result = {
        "served": {str(k): v for k, v in served.items()},
        "failures": failures,
        "totals": {**totals, "stale_refusals": sum(c.counters.chunks_rejected["stale_seq"] for c in clients)},
        "telemetry": {str(k): v for k, v in telemetry.items()},
        "replaced": {str(k): v for k, v in replaced.items()},
        "resent": {str(k): v for k, v in resent.items()},
        "gone": gone,
        "lag": lag,
    }
    await anyio.Path(args.out).write_text(json.dumps(result))


async def _monitor(args: argparse.Namespace) -> None:
    from servo.monitor import MonitorConfig, run_monitor

    # The bench's fleet is made here: its robots and replicas are believed as they first speak.
    key = Path(args.out).with_name("monitor.key")
    key.write_text(f"servo-identity-v1 {base64.urlsafe_b64encode(BENCH_MONITOR.seed).decode()}\n")
    key.chmod(0o600)
    config = MonitorConfig(
        connect=[f"tcp/127.0.0.1:{args.router}"],
        http_port=args.port,
        identity_key=str(key),
        state_file=str(key.with_name("monitor.state")),
        trust_first_use=True,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(run_monitor, config)
        print("READY", flush=True)
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                break
        tg.cancel_scope.cancel()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benches._scale")
    parser.add_argument("role", choices=("router", "serve", "robots", "monitor"))
    parser.add_argument("--port", type=int)
    parser.add_argument("--router", type=int)
    parser.add_argument("--replica", default="r0")
    parser.add_argument("--compute-ms", type=float, default=10.0)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--rate", type=float, default=0.5)
    parser.add_argument("--out", default="robots.json")
    parser.add_argument("--telemetry-hz", type=float, default=0.0)
    parser.add_argument("--health-port", type=int, default=0)
    parser.add_argument("--robot-metrics", type=int, default=256)
    args = parser.parse_args(argv)
    from servo.logs import configure_logging

    configure_logging("error")
    role = {"router": _router, "serve": _serve, "robots": _robots, "monitor": _monitor}[args.role]
    anyio.run(role, args, backend="asyncio", backend_options={"use_uvloop": True})


if __name__ == "__main__":
    main(sys.argv[1:])
