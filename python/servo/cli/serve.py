"""``servo-serve manifest.toml``: load, warm and serve one policy until Ctrl-C / SIGTERM."""

from __future__ import annotations

import argparse
import sys

import anyio
import zenoh
from anyio.abc import TaskStatus

from servo.cli.lifecycle import first_error
from servo.cli.ports import PortInUseError, refuse_busy
from servo.logs import configure_logging
from servo.server.manifest import Manifest, ManifestError, load_manifest


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(prog="servo-serve", description=__doc__)
    parser.add_argument("manifest", help="path of the server manifest (TOML)")
    parser.add_argument(
        "--listen",
        action="append",
        metavar="ENDPOINT",
        help="override zenoh.listen (repeatable), e.g. tcp/0.0.0.0:7447",
    )
    parser.add_argument("--health-port", type=int, metavar="PORT", help="override ops.health_port (0 disables)")
    parser.add_argument("--log-level", default="info", help="debug, info, warning, error")
    parser.add_argument("--json-logs", action="store_true", help="log JSON lines instead of console text")
    return parser


async def serve(manifest: Manifest) -> None:
    """Run the server until drained by a signal."""
    from servo.cli.lifecycle import on_signal
    from servo.server.service import PolicyServer, ServerReady

    server = PolicyServer(manifest)
    async with anyio.create_task_group() as tg:

        async def run_server(*, task_status: TaskStatus[ServerReady]) -> None:
            await server.run(task_status=task_status)
            tg.cancel_scope.cancel()

        tg.start_soon(on_signal, server.drain)
        _say(f"loading {manifest.model.source} on {manifest.model.device}, {manifest.model.warmup} warm-up forward(s)…")
        ready: ServerReady = await tg.start(run_server)
        info, z = ready.info, manifest.zenoh
        _say(
            f"serving {info.model} rev {info.revision} ({info.serving_mode}, "
            f"chunk {info.chunk_size} @ {info.fps:g} fps, RTC {'yes' if info.supports_rtc else 'no'})"
        )
        _say(f"actions: {', '.join(info.features.action_names)}; cameras: {', '.join(info.features.cameras) or 'none'}")
        _say(f"zenoh {z.mode}: listen {z.listen or '-'} connect {z.connect or '-'}; key {ready.keys.prefix}")
        if ready.health_port:
            _say(f"health http://{manifest.ops.health_host}:{ready.health_port}/healthz  metrics /metrics")
        _say("ready — Ctrl-C to drain and stop")


def _with_overrides(manifest: Manifest, args: argparse.Namespace) -> Manifest:
    from msgspec.structs import replace

    if args.listen:
        zenoh = replace(manifest.zenoh, listen=list(args.listen))
        zenoh.validate()
        manifest = replace(manifest, zenoh=zenoh)
    if args.health_port is not None:
        manifest = replace(manifest, ops=replace(manifest.ops, health_port=args.health_port))
    return manifest


def _say(text: str) -> None:
    print(f"servo-serve: {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``servo-serve``: 0 after a clean drain, 2 for a bad manifest or policy."""
    from servo.policy import PolicyLoadError

    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, json=args.json_logs)
    try:
        manifest = _with_overrides(load_manifest(args.manifest), args)
        refuse_busy(manifest.zenoh.listen, manifest.ops.health_host, manifest.ops.health_port)
        anyio.run(serve, manifest, backend="asyncio", backend_options={"use_uvloop": True})
    except (ManifestError, ValueError) as exc:
        _say(f"error: {exc}")
        return 2
    except PortInUseError as exc:
        _say(f"error: {exc} (another servo-serve?); stop it or choose free ports with --listen, --health-port")
        return 2
    except KeyboardInterrupt:
        return 130
    except BaseException as group:
        error = first_error(group)
        if isinstance(error, PolicyLoadError | ManifestError):
            _say(f"error: {error}")
            return 2
        if isinstance(error, OSError | zenoh.ZError):
            # zenoh appends source paths of its own build to messages; users need the first part.
            _say(f"error: {str(error).split(' at /')[0]}")
            return 1
        raise
    _say("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
