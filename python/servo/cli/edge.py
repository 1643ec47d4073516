"""``servo-edge --robot sim``: drive a robot with chunks from a policy server (or a local policy).

Exit codes: 0 after a normal stop, 1 when no server could be reached, 2 for a configuration or
capability mismatch, 3 when the engine died (safe teardown ran), 130 on a second Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import anyio

from servo.cli.lifecycle import first_error
from servo.edge.config import EdgeConfigError, add_config_flags, load_config
from servo.logs import configure_logging


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="servo-edge", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--robot", required=True, help="robot type: sim or so100")
    parser.add_argument(
        "--robot-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="robot option, repeatable (sim: fps, cameras, width, height, ...; so100: port, calibration, cameras)",
    )
    parser.add_argument("--config", help="edge options from a TOML file (flags override it)")
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    parser.add_argument("--summary", help="write a JSON run summary here")
    parser.add_argument("--record", help="record the episode (state, executed actions, provenance) to this file")
    parser.add_argument(
        "--record-images",
        type=int,
        default=0,
        metavar="N",
        help="also record camera frames every N ticks",
    )
    parser.add_argument(
        "--replay",
        metavar="FILE|server:NAME",
        help="replay a recorded trajectory (a recording file, or a trajectory of the server's library)",
    )
    parser.add_argument("--loop", action="store_true", help="with --replay: start over at the end")
    parser.add_argument("--no-status", action="store_true", help="no live status line")
    parser.add_argument("--log-level", default="info", help="debug, info, warning, error")
    parser.add_argument("--json-logs", action="store_true", help="log JSON lines")
    add_config_flags(parser)
    return parser


def _robot_options(items: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise EdgeConfigError(f"--robot-opt expects KEY=VALUE, got {item!r}")
        options[key] = value
    return options


async def run(args: argparse.Namespace) -> int:
    """Build everything and run; returns the exit code."""
    from servo.cli.lifecycle import on_signal
    from servo.edge.engine import EngineBase
    from servo.edge.engines import make_engine
    from servo.edge.runtime import EdgeRuntime, RunOptions
    from servo.robots import make_robot

    config = load_config(args.config, args)
    robot = make_robot(args.robot, _robot_options(args.robot_opt))
    if args.replay:
        from servo.edge.replay import ReplayEngine

        engine: EngineBase = ReplayEngine(config, robot.spec, args.replay, loop=args.loop)
    else:
        engine = make_engine(config, robot.spec)
    options = RunOptions(
        duration_s=args.duration,
        summary_path=args.summary,
        record_path=args.record,
        record_images_every=args.record_images,
        status=not args.no_status and sys.stderr.isatty(),
    )
    runtime = EdgeRuntime(robot, engine, config, options)
    async with anyio.create_task_group() as tg:
        tg.start_soon(on_signal, lambda: runtime.request_stop("signal"))
        summary = await runtime.run()
        tg.cancel_scope.cancel()
    print(
        f"servo-edge: {summary.stop_reason}; {summary.ticks} ticks, {summary.actions_executed} actions, "
        f"{summary.fallback_ticks} fallback ticks, {summary.chunks_received} chunks, rtt p50 "
        f"{summary.rtt_ms['p50']} ms, jitter p99 {summary.tick_jitter_ms['p99']} ms, final state {summary.final_state}",
        file=sys.stderr,
    )
    return 3 if summary.final_state == "dead" else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``servo-edge``."""
    from servo.edge.errors import EdgeStartError
    from servo.robots import CalibrationError, FeetechError

    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, json=args.json_logs)
    try:
        return anyio.run(run, args, backend="asyncio", backend_options={"use_uvloop": True})
    except KeyboardInterrupt:
        return 130
    except BaseException as group:
        exc = first_error(group)
        if isinstance(exc, EdgeConfigError | ValueError | CalibrationError):
            print(f"servo-edge: error: {exc}", file=sys.stderr)
            return 2
        if isinstance(exc, EdgeStartError):
            print(f"servo-edge: error: {exc}", file=sys.stderr)
            return 2 if exc.refused else 1
        if isinstance(exc, FeetechError | OSError):
            print(f"servo-edge: error: robot: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
