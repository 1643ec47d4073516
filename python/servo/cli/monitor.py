"""``servo-monitor``: a live web page of the fleet (replicas, robots, latencies, events), plus /metrics.

It joins the fleet's router like any member (``--connect``, ``--tls-*`` or ``--auth-*``: a
``[[monitors]]`` identity of the fleet file) and serves the page on ``--http-host``:``--http-port``
(127.0.0.1:9200). It believes replicas whose identity it was given (``--trusted-servers``, or the
``[[servers]]`` of ``--fleet``) and robots the fleet enrolled (``--robot-keys``, the fleet file's
``[[robots]]``, the rosters those replicas sign); ``--trust-first-use`` believes whoever speaks
first instead. ``servo-monitor --identity`` prints its operator identity, which servers list in
``[security] operators`` and robots encrypt their telemetry to. Exit codes: 0 after Ctrl-C /
SIGTERM, 1 when the router cannot be reached or the port is busy, 2 for a bad option, robot keys,
fleet, identity or state file.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import TYPE_CHECKING, NoReturn

import anyio
import zenoh

from servo.cli.flags import HelpFormatter, add_struct_flags, struct_flag_values
from servo.cli.lifecycle import exit_process, on_signal, run_service
from servo.config import ConfigError, convert
from servo.logs import configure_logging
from servo.wire import fingerprint

if TYPE_CHECKING:
    from servo.monitor import MonitorConfig

PROG = "servo-monitor"
#: What a machine without the monitor extra is told to run.
MONITOR_EXTRA = "pip install 'servo-robotics[monitor]'"
MONITOR_EXTRA = "pip install 'servo-robotics[monitor]'"


def build_parser() -> argparse.ArgumentParser:
    """The command line: every `MonitorConfig` field is a flag."""
    from servo.monitor import MonitorConfig

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=HelpFormatter)
    add_struct_flags(parser, MonitorConfig, "monitor options")
    parser.add_argument(
        "--identity", action="store_true", help="Print this monitor's operator identity (created if missing), exit."
    )
    parser.add_argument("--log-level", default="warning", help="debug, info, warning or error.")
    parser.add_argument("--json-logs", action="store_true", help="Log JSON lines instead of console text.")
    parser.add_argument("--debug", action="store_true", help="Show the traceback of an unexpected error.")
    return parser


def load(args: argparse.Namespace) -> MonitorConfig:
    """The options as a checked `MonitorConfig`.

    Raises:
        ConfigError: a bad value, naming the option.
    """
    from servo.monitor import MonitorConfig

    return convert(struct_flag_values(args, MonitorConfig), MonitorConfig, origin="command line", strict=False)


async def serve(config: MonitorConfig) -> None:
    """Run until SIGINT/SIGTERM."""
    from servo.monitor import MonitorReady, run_monitor

    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: on_signal(tg.cancel_scope.cancel, lambda: None, say=_say, what="still closing"))
        ready: MonitorReady = await tg.start(run_monitor, config)
        _say(f"serving the fleet page on {ready.url} (joined {', '.join(config.connect)}); Ctrl-C to stop")


def _say(text: str) -> None:
    print(f"{PROG}: {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``servo-monitor``."""
    if importlib.util.find_spec("prometheus_client") is None:
        _say(f"error: servo-monitor needs prometheus_client, which is not installed: {MONITOR_EXTRA}")
        return 2
    from servo.identity import IdentityError
    from servo.monitor import TrustError

    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, json=args.json_logs)
    try:
        config = load(args)
    except ConfigError as exc:
        _say(f"error: {exc}")
        return 2
    if args.identity:
        return show_identity(config.identity_key)
    return run_service(
        lambda: serve(config),
        say=_say,
        known={(TrustError, ConfigError, IdentityError): 2, (zenoh.ZError, OSError): 1},
        debug=args.debug,
    )


def show_identity(path: str) -> int:
    """``servo-monitor --identity``: print this monitor's fingerprint (creating the identity); the exit code."""
    from servo.identity import IdentityError, operator_identity

    try:
        identity = operator_identity(path)
    except IdentityError as exc:
        _say(f"error: {exc}")
        return 2
    text = fingerprint(identity.public_key)
    print(text)
    _say(f'a server lets it read the fleet with [security] operators = [{{name = "<name>", identity = "{text}"}}]')
    return 0


def script() -> NoReturn:
    """Console-script entry of ``servo-monitor``: `main`, then the process ends at once (`exit_process`)."""
    exit_process(main())


if __name__ == "__main__":
    script()
