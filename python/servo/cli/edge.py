"""``servo-edge --robot sim``: drive a robot with chunks from a policy server (or a local policy).

``servo-edge --identity`` prints this robot's identity (for a server's ``[security] robots``);
``servo-edge trust …`` edits the servers it trusts (``servo-edge trust --help``).

Exit codes: 0 after a normal stop, 1 when no server (or robot) could be reached, 2 for a
configuration or capability mismatch, 3 when the engine died, the control loop faulted (e.g. a
non-finite action) or the control loop ended (the summary says whether the arm was parked), 130 when a
third Ctrl-C cut the shutdown short.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any, NoReturn

import anyio

from servo.cli.console import Console
from servo.cli.flags import HelpFormatter, add_struct_flags, struct_flag_values
from servo.cli.lifecycle import INTERRUPTED, exit_process, first_error, on_signal
from servo.cli.notify import notify_edge, stopping
from servo.config import ConfigError, convert, fields_of
from servo.edge.config import EdgeConfig, load_edge_config
from servo.edge.display import INSTALL_HINT, DisplayConfig
from servo.logs import configure_logging
from servo.systemd import Notifier

PROG = "servo-edge"
#: Subcommands dispatched before the edge's own parser: name -> the module with their
#: ``main(argv, console)`` and ``build_parser()``.
SUBCOMMANDS = {"trust": "servo.cli.trust"}


def robot_help(robot: str) -> str:
    """A robot's summary and its options, as ``--help`` and ``--robot-help`` show them.

    Raises:
        ConfigError: unknown robot type or unusable plugin.
    """
    from servo.robots import options_help, robot_summary

    lines = options_help(robot) or ["(no options)"]
    return f"  --robot {robot}: {robot_summary(robot)}\n" + "\n".join(f"      {line}" for line in lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line (every edge option also has a flag; robot options are listed below)."""
    from servo.robots import ROBOTS

    robots = "\n".join(robot_help(name) for name in ROBOTS)
    plugin = (
        "  --robot package.module:factory: a robot plugin (see servo.robots.registry); list its options with\n"
        f"      {PROG} --robot package.module:factory --robot-help"
    )
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__,
        formatter_class=HelpFormatter,
        epilog=f"robot options (--robot-opt KEY=VALUE):\n{robots}\n{plugin}",
    )
    parser.add_argument(
        "--robot",
        metavar="TYPE",
        help=f"Robot to drive (required): {', '.join(ROBOTS)}, or a plugin's package.module:factory.",
    )
    parser.add_argument(
        "--identity", action="store_true", help="Print this robot's identity fingerprint (created if missing), exit."
    )
    parser.add_argument(
        "--robot-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="A robot option (repeatable); each robot's options are listed at the end of this help.",
    )
    parser.add_argument("--robot-help", action="store_true", help="List the options of --robot (a plugin's too), exit.")
    parser.add_argument("--config", help="Read edge options from this TOML file (flags override it).")
    parser.add_argument("--duration", type=float, help="Stop (and park) after this many seconds.")
    parser.add_argument("--summary", help="Write a JSON run summary to this file at the end.")
    parser.add_argument("--record", help="Record every tick (state, executed action, provenance) to this file.")
    parser.add_argument("--overwrite", action="store_true", help="Let --record replace an existing file.")
    parser.add_argument(
        "--record-images",
        type=int,
        default=0,
        metavar="N",
        help="Also record camera frames (JPEG) every N ticks.",
    )
    parser.add_argument(
        "--replay",
        action=_Replay,
        metavar="FILE|server:NAME",
        help="Replay a recorded trajectory: a recording file, or a trajectory of the server's library "
        "(--inference replay --trajectory FILE|server:NAME).",
    )
    display = parser.add_argument_group(f"live view in Rerun (needs {INSTALL_HINT})")
    display.add_argument("--display", action="store_true", help=_described("spawn"))
    display.add_argument("--display-connect", metavar="URL", help=_described("connect"))
    display.add_argument("--display-save", metavar="FILE.rrd", help=_described("save"))
    display.add_argument("--display-camera-fps", metavar="FPS", help=_described("camera_fps"))
    display.add_argument("--display-jpeg-quality", metavar="Q", help=_described("jpeg_quality"))
    parser.add_argument("--no-status", action="store_true", help="Do not draw the live status line.")
    parser.add_argument("--log-level", default="info", help="debug, info, warning or error.")
    parser.add_argument("--json-logs", action="store_true", help="Log JSON lines instead of console text.")
    parser.add_argument("--debug", action="store_true", help="Show the traceback of an error.")
    add_struct_flags(parser, EdgeConfig, "edge options (flags override the --config TOML; its tables follow)")
    return parser


class _Replay(argparse.Action):
    """``--replay X``: the replay engine, on trajectory X."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        namespace.inference = "replay"
        namespace.trajectory = values


def _described(field: str) -> str:
    doc = next(doc for doc in fields_of(DisplayConfig) if doc.name == field)
    default = "" if doc.type_text in ("bool", "str") else f" [default: {doc.default}]"
    return doc.description + default


def display_config(args: argparse.Namespace) -> DisplayConfig:
    """The ``--display…`` flags as a `DisplayConfig` (checked like any option).

    Raises:
        ConfigError: a value out of range, naming the flag's field.
    """
    values = {
        "spawn": args.display,
        "connect": args.display_connect,
        "save": args.display_save,
        "camera_fps": args.display_camera_fps,
        "jpeg_quality": args.display_jpeg_quality,
    }
    given = {key: value for key, value in values.items() if value not in (None, False)}
    return convert(given, DisplayConfig, origin="--display", strict=False)


def robot_option_values(items: list[str]) -> dict[str, Any]:
    """``--robot-opt KEY=VALUE`` items by key (values stay text; the robot's options parse them)."""
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--robot-opt expects KEY=VALUE, got {item!r}")
        options[key] = value
    return options


async def run(args: argparse.Namespace, console: Console) -> int:
    """Build everything and run; returns the exit code."""
    from servo.edge.adapt import fit_robot
    from servo.edge.display import Display
    from servo.edge.engines import make_engine
    from servo.edge.runtime import EdgeRuntime, RunOptions
    from servo.edge.telemetry import TelemetryPublisher
    from servo.robots import RobotDescription

    config = load_edge_config(args.config, struct_flag_values(args, EdgeConfig))
    view = display_config(args)
    display = Display(view) if view.enabled else None  # imports Rerun: fails before anything starts
    # A sim given no joints, rate or cameras takes the served policy's: a demo works for any checkpoint.
    robot = await fit_robot(RobotDescription(args.robot, robot_option_values(args.robot_opt)), config)
    engine = make_engine(config, robot.spec())  # the control process builds the driver again to drive it
    options = RunOptions(
        duration_s=args.duration,
        summary_path=args.summary,
        record_path=args.record,
        record_overwrite=args.overwrite,
        record_images_every=args.record_images,
        status=None if args.no_status or not console.live else console.status,
        display=display,
    )
    if config.telemetry_period_s > 0:
        identity = await anyio.to_thread.run_sync(config.security.identity)
        options.telemetry = TelemetryPublisher(identity, period_s=config.telemetry_period_s, readers=config.readers())
    runtime = EdgeRuntime(robot, engine, config, options)
    notifier = Notifier.from_environment()
    async with anyio.create_task_group() as tg:
        if notifier is not None:
            tg.start_soon(notify_edge, notifier, runtime)
        tg.start_soon(
            lambda: on_signal(
                stopping(notifier, lambda: runtime.request_stop("signal")),
                runtime.hurry,
                say=lambda text: console.say(f"{PROG}: {text}"),
                what="still parking the arm",
            )
        )
        summary = await runtime.run()
        tg.cancel_scope.cancel()
    console.clear_status()
    rtt = summary.rtt_ms["p50"]
    rejected = sum(summary.chunks_rejected.values())
    reasons = ", ".join(f"{n} {reason}" for reason, n in summary.chunks_rejected.items() if n)
    stalls = sum(summary.stalls.values())
    console.say(
        f"{PROG}: {summary.stop_reason}; {summary.ticks} ticks, {summary.actions_executed} actions, "
        f"{summary.fallback_ticks} fallback ticks, {summary.chunks_received} chunks"
        + (f" ({rejected} rejected: {reasons})" if rejected else "")
        + (f", stalled {stalls} time(s): {next(iter(summary.stalls))}" if stalls else "")
        + (f", {summary.rogue_servers} untrusted replicas skipped" if summary.rogue_servers else "")
        + (f", rtt p50 {rtt} ms" if rtt is not None else "")
        + f", jitter p99 {summary.tick_jitter_ms['p99']} ms, final state {summary.final_state}"
        + (f", fault: {summary.fault}" if summary.fault else "")
    )
    return 3 if summary.final_state == "dead" else 0


def classify(exc: BaseException) -> tuple[int, str] | None:
    """Exit code and one-line message of an error that ends a run, or None if it is unexpected."""
    from servo.edge.errors import EdgeStartError
    from servo.identity import IdentityError
    from servo.robots import CalibrationError, FeetechError

    if isinstance(exc, ConfigError | CalibrationError | IdentityError):
        return 2, str(exc)
    if isinstance(exc, EdgeStartError):
        return (2 if exc.refused else 1), str(exc)
    if isinstance(exc, FeetechError | OSError):
        return 1, f"robot: {exc}"
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED, "interrupted"
    return None


def show_robot_help(robot: str, console: Console) -> int:
    """``--robot-help``: print the robot's options; exit code 0, or 2 for an unusable robot."""
    try:
        text = robot_help(robot)
    except ConfigError as error:
        console.say(f"{PROG}: error: {error}")
        return 2
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``servo-edge``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in SUBCOMMANDS:
        return int(importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:], Console()))
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console()
    configure_logging(args.log_level, json=args.json_logs, stream=console)
    if args.identity:
        from servo.cli.trust import show_identity

        return show_identity(args.identity_key or "", console)
    if args.robot is None:
        parser.error("the following arguments are required: --robot")
    if args.robot_help:
        return show_robot_help(args.robot, console)
    try:
        return anyio.run(run, args, console, backend="asyncio", backend_options={"use_uvloop": True})
    except BaseException as group:
        exc = first_error(group)
        if args.debug or isinstance(exc, SystemExit):
            raise
        console.clear_status()
        known = classify(exc)
        if known is None:
            console.say(f"{PROG}: error: unexpected {type(exc).__name__}: {exc} (--debug shows the traceback)")
            return 1
        code, message = known
        console.say(f"{PROG}: error: {message}")
        return code


def script() -> NoReturn:
    """Console-script entry of ``servo-edge``: `main`, then the process ends at once (`exit_process`)."""
    exit_process(main())


if __name__ == "__main__":
    script()
