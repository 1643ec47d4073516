"""Robot processes of the rebalance benchmark (bench_rebalance.py): robots that settle as the edge does.

``python -m benches._settle --router P --first I --count M --rule new|old --out FILE`` — M robots
sharing one Zenoh client session (router and replicas: `benches._scale`). Each opens a session on
the replica there is (`PolicyClient.connect_best` without settling) and holds it, sending nothing.
Whenever a replica's liveliness token appears, every robot settles the way a streaming edge does
(`RemoteEngine`): it looks at the fleet, and each time the rule says move it switches to the new
session, closes the old one and settles again from there. A robot whose session is lost (its
replica drained) places itself again at once, without settling. Prints ``CONNECTED`` once every
robot holds a session; on SIGTERM writes every move (monotonic s, robot, from, to) as JSON.

``--rule old`` is the baseline: servo's settling before issue 30 (`old_rebalance`), kept here only
to measure against: a look every 0-30 ms, each robot of a replica two or more sessions above the
emptiest moves with the chance (here - mean) / here, at once, and looks again at once after it.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
from typing import Any

import anyio

APP = "scale"


def old_look(mine: Any, servers: list[Any]) -> tuple[bool, Any] | None:
    """The rule before issue 30: (balanced, where to move now or None); None: stop looking."""
    here_info = next((s for s in servers if s.keys == mine), None)
    others = [s for s in servers if s is not here_info and not s.status.draining]
    if here_info is None or not others:
        return None
    target = min(others, key=lambda s: s.status.active_sessions)
    here = here_info.status.active_sessions
    if here - target.status.active_sessions < 2:
        return True, None
    mean = sum(s.status.active_sessions for s in [here_info, *others]) / (len(others) + 1)
    return False, target if random.random() < (here - mean) / here else None


async def old_rebalance(client: Any, session: Any, features: Any, fps: float) -> Any:
    """`PolicyClient.rebalance` before issue 30 (24 looks, 3 balanced in a row end it)."""
    from servo.client import NoServerFound, RequestTimeout
    from servo.client.errors import RogueServer, SessionRejected

    balanced = 0
    for _ in range(24):
        await anyio.sleep(random.uniform(0.0, 0.03))
        try:
            servers = await client.discover(app=APP, timeout=0.5)
        except NoServerFound:
            return None
        look = old_look(session.server.keys, servers)
        if look is None:
            return None
        if look[0]:
            balanced += 1
            if balanced >= 3:
                return None
            continue
        balanced = 0
        if look[1] is None:
            continue
        try:
            return await client.open_session(look[1], features=features, fps=fps)
        except (SessionRejected, RogueServer, RequestTimeout):
            continue
    return None


async def _robots(args: argparse.Namespace) -> None:
    from zenoh import Sample, SampleKind

    from servo.client import NoServerFound, PolicyClient, RemoteSession, RequestTimeout
    from servo.client.errors import SessionRejected
    from servo.stages import LoopBridge
    from servo.transport import ZenohSettings, open_zsession
    from servo.wire import alive_selector

    moves: list[tuple[float, int, str, str]] = []
    connected = 0
    appeared = anyio.Event()
    bridge = LoopBridge()

    def on_token(sample: Sample) -> None:
        nonlocal appeared
        if sample.kind == SampleKind.PUT:
            appeared.set()
            appeared = anyio.Event()

    async with open_zsession(ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{args.router}"])) as z:
        probe = PolicyClient(z, f"probe-{args.first}")
        with anyio.fail_after(60):
            while True:
                try:
                    policy = (await probe.discover(app=APP))[0].status.policy
                    break
                except NoServerFound:
                    await anyio.sleep(0.2)
        tokens = z.liveliness().declare_subscriber(alive_selector(APP, None), lambda s: bridge.call(on_token, s))

        async def robot(index: int) -> None:
            nonlocal connected
            client = PolicyClient(z, f"robot-{index}")

            async def place() -> RemoteSession:
                while True:
                    try:
                        return await client.connect_best(
                            features=policy.features, fps=policy.fps, app=APP, settle=False
                        )
                    except (NoServerFound, SessionRejected, RequestTimeout):
                        await anyio.sleep(0.1)

            session = await place()
            connected += 1
            if connected == args.count:
                print("CONNECTED", flush=True)
            while True:
                token = appeared
                async with anyio.create_task_group() as either:

                    async def until(event: anyio.Event) -> None:
                        await event.wait()
                        either.cancel_scope.cancel()

                    either.start_soon(until, token)
                    either.start_soon(until, session.lost)
                if session.lost.is_set():
                    session = await place()
                    continue
                while True:
                    if args.rule == "old":
                        moved = await old_rebalance(client, session, policy.features, policy.fps)
                    else:
                        moved = await client.rebalance(session, features=policy.features, fps=policy.fps, app=APP)
                    if moved is None:
                        break
                    moves.append((time.monotonic(), index, session.server.keys.replica, moved.server.keys.replica))
                    await session.close(timeout=0.5)
                    session = moved

        async with anyio.create_task_group() as tg:
            for i in range(args.first, args.first + args.count):
                tg.start_soon(robot, i)
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    break
            tg.cancel_scope.cancel()
        tokens.undeclare()
    await anyio.Path(args.out).write_text(json.dumps({"moves": moves}))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benches._settle")
    parser.add_argument("--router", type=int, required=True)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--rule", choices=("new", "old"), default="new")
    parser.add_argument("--out", default="moves.json")
    args = parser.parse_args(argv)
    from servo.logs import configure_logging

    configure_logging("error")
    anyio.run(_robots, args, backend="asyncio", backend_options={"use_uvloop": True})


if __name__ == "__main__":
    main(sys.argv[1:])
