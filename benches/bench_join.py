"""What a join token costs (issue 29): a session open that enrols a new robot, against one that does not.

* ``join-open`` (what the caller sees): ``PolicyClient.open_session`` against an in-process server
  that admits only enrolled robots, Zenoh over TCP on 127.0.0.1, one open at a time, each closed
  before the next. ``open with a join token``: a new robot (new identity, new name) each time,
  proving a token good for all of them, enrolled by that open (the roster written after, off the
  event loop); ``open, robot enrolled (before)``: a robot the server knows already, opening the
  same way. Latency per open, from the monotonic clock around the call: p50 / p99 in
  ``extra_info`` (the benchmark's own time is the whole run: server start included, and torch's
  first import in whichever case runs first).
* ``join-admission`` (in-process, no transport, median per open): the robot signs its open with
  the token's proof, against signing it without; the server's gate admits a join (the proof's
  Ed25519 check and the enrolment in memory), against admitting an enrolled robot's open.

Smoke (CI): ``pytest benches/bench_join.py --benchmark-disable``.
Measure: ``pytest benches/bench_join.py --benchmark-enable --benchmark-only -s``.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import anyio
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from benches._support import percentiles_ms
from servo._core import SCHEMA_VERSION, SIGNATURE_SIZE, KeyPair
from servo.access import Access, AccessRules, Caller
from servo.client import PolicyClient
from servo.client.trust import signed_open
from servo.home import roster_path
from servo.identity import Identity, server_identity
from servo.join import JoinToken
from servo.server.admission import ReturningRobots
from servo.server.joins import JoinDesk, issue
from servo.server.manifest import LimitsSection, parse_manifest
from servo.server.robots import RobotGate
from servo.server.roster import Roster, RosterFile
from servo.server.service import PolicyServer, ServerReady
from servo.transport import ZenohSettings
from servo.wire import Features, SessionOpen, fingerprint
from testbed.processes import free_port

OPENS, SMOKE_OPENS, WARMUP = 60, 3, 2
JOIN, ENROLLED = "open with a join token", "open, robot enrolled (before)"
_ENROLLED = Identity.generate()
_MANIFEST = """
[model]
source = "reference"
warmup = 1
[model.options]
cameras = {{front = [48, 64]}}
[zenoh]
listen = ["tcp/127.0.0.1:{port}"]
[ops]
health_port = 0
[limits]
session_opens_per_s = 100000.0
session_open_burst = 100000
client_opens_per_s = 100000.0
client_open_burst = 100000
[security]
join_token_ttl_s = 0
robots = [{{name = "enrolled", identity = "{identity}"}}]
"""


async def _opens(case: str, count: int) -> list[float]:
    """Latencies (ms) of ``count`` session opens of ``case``, after `WARMUP` of them."""
    # The server's identity and a token good for every robot, in its roster before it starts.
    identity = server_identity("", "default").public_key
    token = Roster(roster_path("default")).change(
        lambda f: issue(f, JoinToken.issue(identity), ttl_s=3600, uses=count + WARMUP, now=time.time())
    )
    port = free_port()
    server = PolicyServer(parse_manifest(_MANIFEST.format(port=port, identity=fingerprint(_ENROLLED.public_key))))
    settings = ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{port}"])
    out: list[float] = []
    async with anyio.create_task_group() as tg:
        ready: ServerReady = await tg.start(server.run)
        for i in range(count + WARMUP):
            joining = case == JOIN
            robot, name = (Identity.generate(), f"robot-{i}") if joining else (_ENROLLED, "enrolled")
            async with PolicyClient.connect(settings, name, identity=robot, join=token if joining else None) as c:
                (info,) = [s for s in await c.discover() if s.keys == ready.keys]
                started = time.perf_counter()
                session = await c.open_session(info, features=ready.info.features, fps=ready.info.fps)
                elapsed_ms = (time.perf_counter() - started) * 1e3
                await session.close()
            if i >= WARMUP:
                out.append(elapsed_ms)
        server.drain()
    return out


@pytest.mark.parametrize("case", [JOIN, ENROLLED])
def test_join_open(benchmark: BenchmarkFixture, case: str) -> None:
    benchmark.group = "join-open"
    count = SMOKE_OPENS if benchmark.disabled else OPENS
    latencies: list[float] = benchmark.pedantic(
        lambda: anyio.run(_opens, case, count, backend="asyncio", backend_options={"use_uvloop": True}),
        rounds=1,
        iterations=1,
    )
    p50, p99 = percentiles_ms(latencies, [0.5, 0.99])
    stats: dict[str, Any] = {"opens": len(latencies), "p50_ms": round(p50, 3), "p99_ms": round(p99, 3)}
    benchmark.extra_info.update(stats)
    benchmark.extra_info["correct"] = len(latencies) == count
    print(f"\n{case}: {stats}", flush=True)
    assert benchmark.extra_info["correct"]


_LIMITS = LimitsSection(
    session_opens_per_s=1e9, session_open_burst=10**9, client_opens_per_s=1e9, client_open_burst=10**9
)
_PREFIX = "@servo/bench/model/r0"
_FEATURES = Features(["j0", "j1", "j2", "j3", "j4", "j5"], ["j0", "j1", "j2", "j3", "j4", "j5"], {})
_SERVER = Identity.generate()


def _open(name: str) -> SessionOpen:
    return SessionOpen(name, [SCHEMA_VERSION], _FEATURES, 30.0, KeyPair().public_key, task="sweep")


@pytest.mark.parametrize("case", ["client: sign with the join proof", "client: sign (before)"])
def test_join_signing(benchmark: BenchmarkFixture, case: str) -> None:
    benchmark.group = "join-admission"
    token = JoinToken.issue(_SERVER.public_key) if case.endswith("proof") else None
    signed = benchmark(lambda: signed_open(_open("robot-7"), _ENROLLED, prefix=_PREFIX, nonce=bytes(16), join=token))
    correct = len(signed.join_signature) == (SIGNATURE_SIZE if token else 0)
    benchmark.extra_info["correct"] = correct
    assert correct


@pytest.mark.parametrize("case", ["server: admit a join", "server: admit an enrolled robot (before)"])
def test_join_admission(benchmark: BenchmarkFixture, case: str) -> None:
    benchmark.group = "join-admission"
    joining = case == "server: admit a join"
    access = Access(AccessRules(_SERVER.public_key, robots={"enrolled": _ENROLLED.public_key}))
    desk = JoinDesk(None, access, {"enrolled": _ENROLLED.public_key})
    file, token = issue(RosterFile(), JoinToken.issue(_SERVER.public_key), ttl_s=3600, uses=10**6, now=time.time())
    desk.apply(file)
    gate = RobotGate(access, desk, _LIMITS, ReturningRobots())
    nonce, names = gate.nonces.current(), itertools.count()

    def fresh() -> tuple[tuple[SessionOpen], dict[str, Any]]:
        if joining:
            request = signed_open(
                _open(f"robot-{next(names)}"), Identity.generate(), prefix=_PREFIX, nonce=nonce, join=token
            )
        else:
            request = signed_open(_open("enrolled"), _ENROLLED, prefix=_PREFIX, nonce=nonce)
        return (request,), {}

    outcomes: list[object] = []
    benchmark.pedantic(lambda request: outcomes.append(gate.admit(request, _PREFIX)), setup=fresh, rounds=300)
    enrolled = 1 + (len(outcomes) if joining else 0)  # each join enrolled its robot, nothing else did
    correct = all(isinstance(o, Caller) and o.enrolled for o in outcomes) and len(access.rules.robots) == enrolled
    benchmark.extra_info["correct"] = correct
    assert correct
