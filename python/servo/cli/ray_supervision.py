"""``servo-serve --ray``: the manifest's replicas as Ray actors, supervised until a signal.

One line per replica as it becomes ready (again after Ray restarts it), a rolling restart per
SIGHUP (each replica drained and started again, one at a time), and every replica drained on
Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import math
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from servo.cli.console import Console
from servo.cli.lifecycle import on_signal
from servo.server.manifest import Manifest

if TYPE_CHECKING:
    from servo.deploy.host import ReplicaStatus
    from servo.deploy.ray import Deployment

PROG = "servo-serve"
#: ``--ray-*`` flag → `servo.deploy.ray.RayOptions` field.
RAY_FLAGS = {
    "ray_address": "address",
    "replicas": "replicas",
    "ray_num_cpus": "num_cpus",
    "ray_max_restarts": "max_restarts",
}


def serve_on_ray(manifest: Manifest, args: argparse.Namespace, console: Console) -> int:
    """Deploy the replicas on Ray and supervise them until a signal; the exit code."""
    from servo.deploy.ray import deploy  # needs the ray extra (see `classify`)

    options: dict[str, Any] = {
        field: value for flag, field in RAY_FLAGS.items() if (value := getattr(args, flag)) is not None
    }
    options |= {"log_level": args.log_level.lower(), "json_logs": args.json_logs}
    # deploy() connects to Ray on this (main) thread, where Ray installs its SIGTERM handler;
    # `on_signal` replaces it while the replicas are supervised.
    deployment = deploy(manifest, manifest_path=args.manifest, **options)
    opts, gpu = deployment.options, manifest.model.device.startswith("cuda")
    console.say(
        f"{PROG}: started {opts.replicas} replica(s) of {manifest.model.source} on Ray ({opts.address}), "
        f"{'one GPU' if gpu else f'{opts.num_cpus:g} CPU'} each; loading…"
    )
    try:
        return anyio.run(supervise, deployment, console, backend="asyncio", backend_options={"use_uvloop": True})
    finally:
        deployment.close()


async def supervise(deployment: Deployment, console: Console) -> int:
    """Report the replicas until a signal, one that cannot start or none left; drain them; the exit code."""

    def say(text: str) -> None:
        console.say(f"{PROG}: {text}")

    code = 0
    report, drain = anyio.CancelScope(), anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        what = "ending the replicas without waiting for their drain"
        tg.start_soon(lambda: on_signal(report.cancel, drain.cancel, say=say, what=what))
        tg.start_soon(_rolling_restarts, deployment, say)
        with report:
            code = await _report(deployment, say)
        with drain:
            for stopped in await deployment.drain():
                say(f"replica {stopped.replica} " + ("drained" if stopped.drained else f"not drained: {stopped.error}"))
        tg.cancel_scope.cancel()
    return code


async def _rolling_restarts(deployment: Deployment, say: Callable[[str], None]) -> None:
    """A rolling restart per SIGHUP (one that arrives meanwhile starts another after it)."""
    with anyio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            if await deployment.rolling_restart(say):
                say("rolling restart done")


async def _report(deployment: Deployment, say: Callable[[str], None]) -> int:
    from servo.deploy.host import ReplicaFailed, ReplicaReady, ReplicaStatus

    started: set[str] = set()
    send, statuses = anyio.create_memory_object_stream[ReplicaStatus](math.inf)
    async with anyio.create_task_group() as tg, statuses:
        tg.start_soon(deployment.watch, send)
        async for status in statuses:
            if isinstance(status, ReplicaFailed) and status.replica not in started:
                say(f"error: replica {status.replica}: {status.error}")
                tg.cancel_scope.cancel()
                return 2 if status.bad_config else 1
            say(_describe(status))
            if isinstance(status, ReplicaReady) and status.replica not in started:
                started.add(status.replica)
                if len(started) == len(deployment.replicas):
                    say("ready — Ctrl-C to drain and stop")
    say("error: no replica left")
    return 1


def _describe(status: ReplicaStatus) -> str:
    from servo.deploy.host import ReplicaFailed, ReplicaReady, ReplicaStopped

    if isinstance(status, ReplicaReady):
        health = f", health port {status.health_port}" if status.health_port else ""
        return (
            f"replica {status.replica} ready: {status.key} ({status.model} rev {status.revision}), "
            f"pid {status.pid} on {status.host}{health}"
        )
    if isinstance(status, ReplicaFailed):
        return f"replica {status.replica} failed: {status.error}"
    assert isinstance(status, ReplicaStopped)
    if status.planned:
        how = "drained" if status.drained else f"not drained: {status.error}"
        return f"replica {status.replica} restarting ({status.planned}): {how}; Ray starts it again"
    if status.restarting:
        return f"replica {status.replica} lost ({status.error}); Ray restarts it"
    return f"replica {status.replica} stopped: {status.error or 'drained'}"
