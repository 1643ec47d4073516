"""``servo-serve manifest.toml``: load, warm and serve one policy until Ctrl-C / SIGTERM.

Exit codes: 0 after a clean drain, 1 when the network or a port is unusable, 2 for a manifest or
policy problem (one line naming the key), 130 when a third Ctrl-C cut the drain short.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskStatus

from servo.cli.console import Console
from servo.cli.lifecycle import INTERRUPTED, first_error, on_signal
from servo.cli.ports import PortInUseError, refuse_busy
from servo.config import ConfigError
from servo.logs import configure_logging
from servo.server.manifest import Manifest, load_manifest

PROG = "servo-serve"
SERVER_EXTRA = "pip install 'servo-robotics[server]'"
#: What the server extra brings; the edge and the client library never import them.
SERVER_DEPENDENCIES = frozenset({"torch", "prometheus_client"})


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("manifest", help="Path of the server manifest (TOML); see examples/manifest.toml.")
    parser.add_argument(
        "--listen",
        action="append",
        metavar="ENDPOINT",
        help="Replace zenoh.listen (repeatable), e.g. tcp/0.0.0.0:7447.",
    )
    parser.add_argument("--health-port", type=int, metavar="PORT", help="Replace ops.health_port (0 disables).")
    parser.add_argument("--log-level", default="info", help="debug, info, warning or error.")
    parser.add_argument("--json-logs", action="store_true", help="Log JSON lines instead of console text.")
    parser.add_argument("--debug", action="store_true", help="Show the traceback of an error.")
    return parser


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Manifest keys replaced by flags (checked by the same rules as the file)."""
    out: dict[str, Any] = {}
    if args.listen:
        out["zenoh.listen"] = list(args.listen)
    if args.health_port is not None:
        out["ops.health_port"] = args.health_port
    return out


async def serve(manifest: Manifest, base_dir: Path, console: Console) -> None:
    """Run the server until drained by a signal."""
    from servo.server.service import PolicyServer, ServerReady

    def say(text: str) -> None:
        console.say(f"{PROG}: {text}")

    server = PolicyServer(manifest, search_path=base_dir)
    async with anyio.create_task_group() as tg:

        async def run_server(*, task_status: TaskStatus[ServerReady]) -> None:
            await server.run(task_status=task_status)
            tg.cancel_scope.cancel()

        tg.start_soon(
            lambda: on_signal(server.drain, server.hurry, say=say, what="not waiting for the request in flight")
        )
        model = manifest.model
        say(f"loading {model.source} on {model.device}, {model.warmup} warm-up forward(s)…")
        ready: ServerReady = await tg.start(run_server)
        info, z = ready.info, manifest.zenoh
        say(
            f"serving {info.model} rev {info.revision} ({info.serving_mode}, "
            f"chunk {info.chunk_size} @ {info.fps:g} fps, RTC {'yes' if info.supports_rtc else 'no'})"
        )
        say(f"actions: {', '.join(info.features.action_names)}; cameras: {', '.join(info.features.cameras) or 'none'}")
        say(f"zenoh {z.mode}: listen {z.listen or '-'} connect {z.connect or '-'}; key {ready.keys.prefix}")
        if ready.health_port:
            say(f"health http://{manifest.ops.health_host}:{ready.health_port}/healthz  metrics /metrics")
        say("ready — Ctrl-C to drain and stop")


def classify(exc: BaseException) -> tuple[int, str] | None:
    """Exit code and one-line message of an error that ends the server, or None if unexpected."""
    import zenoh

    from servo.policy import PolicyLoadError

    if isinstance(exc, ConfigError | PolicyLoadError):
        return 2, str(exc)
    if isinstance(exc, PortInUseError):
        return 2, f"{exc} (another servo-serve?); stop it or choose free ports with --listen, --health-port"
    if isinstance(exc, ModuleNotFoundError) and exc.name in SERVER_DEPENDENCIES:
        return 2, f"serving needs {exc.name}, which is not installed: {SERVER_EXTRA}"
    if isinstance(exc, zenoh.ZError):
        # zenoh appends source paths of its own build to messages; users need the first part.
        return 1, f"zenoh: {str(exc).split(' at /')[0]}"
    if isinstance(exc, OSError):
        return 1, str(exc)
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED, "interrupted"
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``servo-serve``."""
    args = build_parser().parse_args(argv)
    console = Console(live=False)
    configure_logging(args.log_level, json=args.json_logs, stream=console)
    try:
        manifest = load_manifest(args.manifest, overrides=overrides(args))
        refuse_busy(manifest.zenoh.listen, manifest.ops.health_host, manifest.ops.health_port)
        anyio.run(
            serve,
            manifest,
            Path(args.manifest).resolve().parent,
            console,
            backend="asyncio",
            backend_options={"use_uvloop": True},
        )
    except BaseException as group:
        exc = first_error(group)
        if args.debug or isinstance(exc, SystemExit):
            raise
        known = classify(exc)
        if known is None:
            console.say(f"{PROG}: error: unexpected {type(exc).__name__}: {exc} (--debug shows the traceback)")
            return 1
        code, message = known
        console.say(f"{PROG}: error: {message}")
        return code
    console.say(f"{PROG}: stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
