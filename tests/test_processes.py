"""Each servo process's thread table, and every servo process gone within a second of its stop.

In process: the threads a server, an edge, a router and a monitor start, by name and count
(servo's own threads are `servo.stages` stages named ``servo-…``; Zenoh runs a Python thread for
each callback entity that is not `servo.transport.direct`), and that every one of them has ended
within a second of the close. AnyIO's worker threads are the event loop's pool, shared by
whatever runs on the loop and ended by it (after 10 s idle), so they belong to no component.

As processes, the command-line tools as a user runs them: each exits within a second of SIGTERM
(the edge within a second of the end of its safe teardown, which parks the arm first), also with
16 busy loops loading the 2-core machine (slow; there the kernel's teardown of the policy
process's address space, which holds torch, is bounded apart, see the test). The server's policy
process is gone within that second too on a quiet machine.
"""

from __future__ import annotations

import math
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import anyio
import pytest

from servo.edge.remote import RemoteEngine
from servo.edge.runtime import RunOptions
from servo.monitor import MonitorConfig, run_monitor
from servo.router import load_fleet
from servo.router.service import run_router
from testbed.load import CpuHogs
from testbed.processes import ended
from tests.edge.harness import Proc, edge_argv, edge_config, running_edge, small_sim, write_manifest
from tests.router.harness import ROBOTS, SERVERS, fleet_toml
from tests.support import eventually, free_port, make_manifest, running_server

#: A component's threads end this soon after its close; a process exits this soon after its stop.
EXIT_S = 1.0
#: Far beyond any start-up: reaching it fails the test, not a timing.
START_S = 180.0
#: How long the edge may take to park the arm (`servo.edge.runtime.RunOptions.park_timeout_s`).
PARK_TIMEOUT_S = RunOptions().park_timeout_s


def threads_since(before: Collection[threading.Thread]) -> dict[str, int]:
    """The threads alive now that were not in ``before``, by name (Zenoh's as ``zenoh-callback``)."""
    table: Counter[str] = Counter()
    for thread in threading.enumerate():
        if thread in before or thread.name == "AnyIO worker thread":
            continue
        table["zenoh-callback" if "(pyo3-closure)" in thread.name else thread.name] += 1
    return dict(table)


async def all_ended(before: Collection[threading.Thread], what: str) -> None:
    await eventually(lambda: not threads_since(before), EXIT_S, f"every thread of the {what} to end")


def fleet_file(directory: Path, port: int) -> Path:
    """A router's fleet file (password members over plain TCP: no certificates to make)."""
    passwords = directory / "passwords.txt"
    passwords.write_text("".join(f"{name}:pw-{name}\n" for name in [*SERVERS, "gpu-k", *ROBOTS, "dashboard"]))
    path = directory / "fleet.toml"
    path.write_text(fleet_toml("usrpwd", port, None, passwords))
    return path


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("lanes", "intake"),
    [
        # one lane: zenoh-python's callback thread authenticates, admits, decodes, deposits
        (1, {"servo-decode-1": 1}),
        # two lanes: that thread routes; each lane decodes its first camera, the second goes to a
        # decoder of its own (servo.server.lanes)
        (2, {"servo-intake-0": 1, "servo-intake-1": 1, "servo-decode-1": 1, "servo-decode-2": 1}),
    ],
    ids=["one-lane", "two-lanes"],
)
async def test_a_server_runs_one_inference_stage_one_reply_stage_and_a_decoder_per_extra_camera(
    port: int, lanes: int, intake: dict[str, int]
) -> None:
    before = set(threading.enumerate())
    options = "cameras = {front = [48, 64], wrist = [48, 64]}"
    manifest = make_manifest(port, options=options, extra=f"[serving]\nintake_threads = {lanes}\n")
    async with running_server(manifest):
        assert threads_since(before) == {
            "servo-inference": 1,  # the worker: the one thread on the device
            "servo-reply": 1,  # encode, seal, put every answer, in serving order
            "servo-policy-watch": 1,  # waits on the policy process: its death ends the server
            # Observations, six queryables and the clients' tokens: never on Zenoh's receive task
            # (tests/server/test_busy_server.py).
            "zenoh-callback": 8,
            **intake,
        }
    await all_ended(before, "server")


@pytest.mark.anyio
async def test_an_edge_runs_a_sender_and_per_camera_encoder_and_capture_stages(port: int) -> None:
    async with running_server(make_manifest(port)):
        before = set(threading.enumerate())
        # JPEG asked for: on the server's own host ``auto`` sends raw frames and encodes nothing.
        engine = RemoteEngine(edge_config(port, jpeg_quality=85), small_sim().spec())
        async with running_edge(small_sim(), engine):
            await eventually(lambda: engine.chunks_received >= 2, 60, "chunks")
            assert threads_since(before) == {
                "servo-send": 1,  # the session's uplink: encode, pack, seal, put
                "servo-encode-front": 1,  # JPEG, one stage per camera
                "servo-cam-front": 1,  # the simulated camera renders here (the tick runs in its own process)
                # The replica watcher (see RemoteEngine._watch_replicas), and the session's chunks and
                # its server's token: never on Zenoh's receive task (tests/client/test_busy_client.py).
                "zenoh-callback": 3,
            }
        await all_ended(before, "edge")


@pytest.mark.anyio
async def test_a_router_runs_no_thread_and_a_monitor_one_for_telemetry(tmp_path: Path) -> None:
    router_port = free_port()
    fleet = load_fleet(fleet_file(tmp_path, router_port))
    before = set(threading.enumerate())
    async with anyio.create_task_group() as tg:
        await tg.start(run_router, fleet)
        config = MonitorConfig(
            connect=[f"tcp/127.0.0.1:{router_port}"],
            http_port=0,
            auth_user="dashboard",
            auth_password_file=str(tmp_path / "dashboard.secret"),
        )
        (tmp_path / "dashboard.secret").write_text("pw-dashboard\n")
        await tg.start(run_monitor, config)
        # The router runs none; the monitor one: its telemetry subscriber (see FleetCollector.run).
        assert threads_since(before) == {"zenoh-callback": 1}
        tg.cancel_scope.cancel()
    await all_ended(before, "router and monitor")


@contextmanager
def fleet_processes(directory: Path) -> Iterator[dict[str, Proc]]:
    """``servo-serve``, ``servo-edge`` streaming from it, ``servo-router`` and ``servo-monitor`` on it: all ready."""
    server_port, router_port = free_port(), free_port()
    (directory / "dashboard.secret").write_text("pw-dashboard\n")
    py = [sys.executable, "-m"]
    commands = {
        "serve": [*py, "servo.cli.serve", str(write_manifest(directory / "manifest.toml", server_port))],
        "router": [*py, "servo.cli.router", str(fleet_file(directory, router_port))],
        "monitor": [
            *py,
            "servo.cli.monitor",
            *("--connect", f"tcp/127.0.0.1:{router_port}", "--http-port", str(free_port())),
            *("--auth-user", "dashboard", "--auth-password-file", str(directory / "dashboard.secret")),
        ],
    }
    ready = {"serve": "ready", "router": "ready", "monitor": "serving the fleet page", "edge": "control loop running"}
    with ExitStack() as stack:
        procs: dict[str, Proc] = {}
        for name, argv in commands.items():
            if name == "monitor":  # a Zenoh client's open fails at once while its router is not up yet
                procs["router"].wait_line(ready["router"], START_S)
            procs[name] = proc = Proc(argv)
            stack.callback(proc.stop)
        procs["serve"].wait_line(ready["serve"], START_S)
        edge = f"--robot sim --robot-opt cameras=front:64x48 --connect tcp/127.0.0.1:{server_port} --log-level info"
        procs["edge"] = proc = Proc(edge_argv(edge))
        stack.callback(proc.stop)
        for name, proc in procs.items():
            proc.wait_line(ready[name], START_S)
        yield procs


#: The line each process ends its stop with (the edge: its run summary, after parking the arm).
LAST_LINES = {
    "serve": "servo-serve: stopped",
    "router": "servo-router: stopped",
    "monitor": "servo-monitor: stopped",
    "edge": "servo-edge: signal",
}


def stop_all(procs: dict[str, Proc]) -> dict[str, tuple[float, float]]:
    """SIGTERM to every process at once: per process, (s from the signal to its last line, s from
    that line to the process reaped): its stop, then what the exit itself costs. The server's
    policy process (``policy``, not ours to reap) counts from the signal to its pid being gone."""
    reaped: dict[str, float] = {}
    server = procs["serve"].popen.pid
    (policy,) = map(int, Path(f"/proc/{server}/task/{server}/children").read_text().split())

    def reap(name: str, proc: Proc) -> None:
        proc.popen.wait(60)
        reaped[name] = time.monotonic()

    def gone() -> None:  # not our child to reap: its pidfd says when it ends (never: inf, and the test fails)
        reaped["policy"] = time.monotonic() if ended(policy, 60) else math.inf

    reapers = [threading.Thread(target=reap, args=item) for item in procs.items()]
    reapers.append(threading.Thread(target=gone))
    for reaper in reapers:
        reaper.start()
    sent = time.monotonic()
    for proc in procs.values():
        proc.popen.send_signal(signal.SIGTERM)
    for reaper in reapers:
        reaper.join()
    times = {}
    for name, proc in procs.items():
        assert proc.wait(0) == 0, proc.output
        last = proc.seen_at[proc.lines.index(proc.wait_line(LAST_LINES[name], 0))]
        times[name] = (last - sent, reaped[name] - last)
    times["policy"] = (reaped["policy"] - sent, 0.0)
    return times


def test_every_servo_process_exits_within_a_second_of_sigterm(tmp_path: Path) -> None:
    with fleet_processes(tmp_path) as procs:
        times = stop_all(procs)
    assert times["edge"][0] < PARK_TIMEOUT_S + EXIT_S, times  # parking the arm takes what the arm needs
    assert all(stop + exit < EXIT_S for name, (stop, exit) in times.items() if name != "edge"), times
    assert times["edge"][1] < EXIT_S, times


@pytest.mark.slow
def test_every_servo_process_exits_within_a_second_of_sigterm_at_load_16(tmp_path: Path) -> None:
    with fleet_processes(tmp_path) as procs, CpuHogs(16):
        times = stop_all(procs)
    assert times["edge"][0] < PARK_TIMEOUT_S + EXIT_S, times
    assert all(stop < EXIT_S for name, (stop, _) in times.items() if name not in ("edge", "policy")), times
    # What follows the last line is the kernel tearing the process down. For the server that
    # holds torch it is seconds at 1/17 of a core (3.5 s after a bare `import torch; os._exit(0)`
    # beside 16 busy loops, 0.2 s after `import numpy`): bounded, never a hang.
    assert all(exit < EXIT_S for name, (_, exit) in times.items()), times
    # The policy process ends when the server closes its link; then the kernel tears torch down,
    # which takes seconds at 1/17 of a core (3.5 s after a bare `import torch; os._exit(0)` beside
    # 16 busy loops, 0.2 s after `import numpy`): bounded, never a hang.
    assert times["policy"][0] < 10.0, times
