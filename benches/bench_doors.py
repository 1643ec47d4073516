"""What a stranger can make a replica sign (review of issue 29): signatures per second, per door.

A stranger on the server's network floods one signed door (`servo.server.signed_door`) with
``PARALLEL`` queries in flight, for ``DOORS_BENCH_WINDOW_S`` seconds, against an in-process
server on a closed door (the manifest enrols a robot; the stranger is not it), Zenoh over TCP
on 127.0.0.1:

* ``status``: status queries, each with a fresh nonce;
* ``trajectory``: trajectory fetches, each under a freshly minted robot key (random bytes);
* ``audit``: audit queries, each under a freshly minted asker key.

Two cases side by side: ``unbounded (main)`` sets every door budget to its maximum (1e6), which
is main's behaviour (no status budget; the trajectory door signed a stranger's refusal before
its per-key budget, which a fresh key never reaches anyway; the audit door only per key);
``defaults`` is the shipped ``[limits]``. Reported in ``extra_info``: signatures the replica made
per second (``servo_door_signatures_total``), queries the stranger sent per second, and what
came back (signed, unsigned, silence).

Smoke (CI): ``pytest benches/bench_doors.py --benchmark-disable`` (1 s windows).
Measure: ``pytest benches/bench_doors.py --benchmark-enable --benchmark-only -s``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import anyio
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from servo._core import SIGNATURE_SIZE
from servo.client import PolicyClient
from servo.identity import Identity
from servo.server.manifest import parse_manifest
from servo.server.service import PolicyServer
from servo.transport import ZenohSettings, query
from servo.wire import NONCE_SIZE, AuditQuery, Rejection, TrajectoryRequest, decode, encode, fingerprint
from testbed.processes import free_port

PARALLEL = 16
UNBOUNDED = (
    "[limits]\nstatus_queries_per_s = 1e6\nstatus_query_burst = 1000000\n"
    "door_requests_per_s = 1e6\ndoor_request_burst = 1000000\n"
)
CASES = {"unbounded (main)": UNBOUNDED, "defaults": ""}
#: The defaults' (burst, rate) of each door; the audit door signs nothing for a stranger.
_BUDGET = {"status": (3000, 300.0), "trajectory": (600, 100.0), "audit": (0, 0.0)}


def _manifest(port: int, limits: str) -> str:
    robot = fingerprint(Identity.generate().public_key)
    return (
        f'[model]\nsource = "reference"\nwarmup = 1\nplan_forwards = 0\n'
        f'[model.options]\ncameras = {{front = [48, 64]}}\n[zenoh]\nlisten = ["tcp/127.0.0.1:{port}"]\n'
        f'[ops]\nhealth_port = 0\n[security]\nrobots = [{{name = "robot-7", identity = "{robot}"}}]\n'
        f"{limits}"
    )


def _payload(door: str) -> bytes:
    if door == "status":
        return os.urandom(16)
    if door == "trajectory":
        key, sig = os.urandom(32), os.urandom(SIGNATURE_SIZE)
        return encode(TrajectoryRequest("wave", os.urandom(NONCE_SIZE), os.urandom(32), "mallory", key, sig))
    return encode(
        AuditQuery(
            "robot-7",
            asker=os.urandom(32),
            reply_key=os.urandom(32),
            nonce=os.urandom(NONCE_SIZE),
            signature=os.urandom(SIGNATURE_SIZE),
        )
    )


async def _flood(door: str, limits: str, window_s: float) -> dict[str, Any]:
    port = free_port()
    server = PolicyServer(parse_manifest(_manifest(port, limits)))
    seen = {"signed": 0, "unsigned": 0, "silence": 0}
    async with anyio.create_task_group() as tg:
        ready = await tg.start(server.run)
        key = {"status": ready.keys.status, "trajectory": ready.keys.trajectory, "audit": ready.keys.audit}[door]
        settings = ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{port}"])
        async with PolicyClient.connect(settings, "mallory") as mallory:
            signatures = server.metrics.door_signatures.labels(door)
            before, started = signatures._value.get(), time.monotonic()

            async def one() -> None:
                replies = await query(mallory.zsession, key, payload=_payload(door), timeout=10)
                if not replies:
                    seen["silence"] += 1
                    return
                ok, err = replies[0].ok, replies[0].err
                if ok is not None:
                    signed = ok.attachment is not None
                else:
                    assert err is not None
                    signed = bool(decode(err.payload.to_bytes(), Rejection).signature)
                seen["signed" if signed else "unsigned"] += 1

            while time.monotonic() - started < window_s:
                async with anyio.create_task_group() as flood:
                    for _ in range(PARALLEL):
                        flood.start_soon(one)
            elapsed = time.monotonic() - started
            made = signatures._value.get() - before
        server.drain()
    sent = sum(seen.values())
    return {
        "signatures_per_s": round(made / elapsed, 1),
        "queries_per_s": round(sent / elapsed, 1),
        **seen,
        "window_s": round(elapsed, 2),
    }


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("door", ["status", "trajectory", "audit"])
def test_stranger_signatures(benchmark: BenchmarkFixture, door: str, case: str) -> None:
    """Signatures per second a key-minting stranger makes the replica sign at one door."""
    benchmark.group = f"door-{door}"
    window_s = 1.0 if benchmark.disabled else float(os.environ.get("DOORS_BENCH_WINDOW_S", "5"))
    result: dict[str, Any] = benchmark.pedantic(
        lambda: anyio.run(_flood, door, CASES[case], window_s), rounds=1, iterations=1
    )
    benchmark.extra_info.update(result)
    burst, rate = _BUDGET[door]
    most = (burst + rate * (result["window_s"] + 1.0)) / result["window_s"]  # a second's slack
    benchmark.extra_info["correct"] = case != "defaults" or result["signatures_per_s"] <= most
    assert benchmark.extra_info["correct"]
