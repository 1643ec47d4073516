"""``servo-fleet up``: a whole fleet on this machine in one command, until Ctrl-C.

``servo-router`` with a generated fleet file, ``--replicas`` replicas of the reference policy
(``servo-serve`` joining it with ``--connect`` and ``--replica``), ``--robots`` simulated arms
(``servo-edge --robot sim``, each with its own identity, enrolled) and ``servo-monitor``, all on
127.0.0.1, each member logging in with its own generated password. It prints the monitor's
address once the robots stream; Ctrl-C (or SIGTERM) stops the robots (they park), then the
monitor and the replicas (they drain), then the router, each within a bounded time; a second
Ctrl-C kills what is left at once. The fleet's files and every member's log stay in ``--dir``.

Exit codes: 0 after a clean stop, 1 when a member could not start (its log's last lines are
shown), 2 for a bad option, 130 after a second Ctrl-C.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType

from servo.cli.flags import HelpFormatter
from servo.cli.lifecycle import INTERRUPTED
from servo.deploy.local import FleetError, FleetPlan, LocalFleet

PROG = "servo-fleet"
#: How long ``up`` waits for every robot to show as streaming on the monitor before saying so.
STREAMING_WAIT_S = 60.0


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=HelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    up = commands.add_parser(
        "up",
        help="Start a local fleet and keep it running until Ctrl-C.",
        description="servo-router, replicas, simulated robots and servo-monitor on 127.0.0.1 with generated "
        "credentials, until Ctrl-C; the monitor's address is printed once the robots stream.",
        formatter_class=HelpFormatter,
    )
    up.add_argument("--replicas", type=int, default=2, metavar="N", help="Policy server replicas (default 2).")
    up.add_argument("--robots", type=int, default=3, metavar="N", help="Simulated robots (default 3).")
    up.add_argument(
        "--http-port", type=int, default=9200, metavar="PORT", help="The monitor's page (default 9200; 0: a free one)."
    )
    up.add_argument("--router-port", type=int, default=0, metavar="PORT", help="The router's port (default: free).")
    up.add_argument("--no-monitor", action="store_true", help="Do not start servo-monitor.")
    up.add_argument(
        "--dir", metavar="DIR", help="Where the fleet's files and logs go (default: a new servo-fleet-* temp folder)."
    )
    up.add_argument("--log-level", default="warning", help="The members' log level (their logs are in DIR/logs).")
    return parser


def _say(text: str) -> None:
    print(f"{PROG}: {text}", file=sys.stderr, flush=True)


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the options (one line naming the flag), or None."""
    if not 0 < args.replicas <= 16:
        return "--replicas: between 1 and 16"
    if not 0 <= args.robots <= 64:
        return "--robots: between 0 and 64"
    for flag in ("http_port", "router_port"):
        if not 0 <= getattr(args, flag) <= 65535:
            return f"--{flag.replace('_', '-')}: a port number, 0 to 65535"
    if args.dir and Path(args.dir).exists() and any(Path(args.dir).iterdir()):
        return f"--dir: {args.dir} is not empty (a fleet's generated files are never overwritten)"
    return None


def up(args: argparse.Namespace) -> int:
    """Start the fleet, report it, wait for a signal, stop it; the exit code."""
    stop = threading.Event()
    interrupts = 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupts
        interrupts += 1
        stop.set()
        if interrupts >= 2:
            raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    directory = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="servo-fleet-"))
    plan = FleetPlan(
        replicas=args.replicas,
        robots=args.robots,
        monitor=not args.no_monitor,
        http_port=args.http_port,
        router_port=args.router_port,
        log_level=args.log_level,
    )
    _say(f"starting in {directory} (logs in {directory / 'logs'})")
    fleet = LocalFleet(directory, plan, say=_say)
    try:
        try:
            fleet.start(cancel=stop)
        except FleetError as exc:
            if stop.is_set():
                _say("stopped before the fleet was up")
                return 0
            _say(f"error: {exc}")
            return 1
        report(fleet, stop)
        watch(fleet, stop)
        _say("stopping: robots park, replicas drain (Ctrl-C again kills them)")
        statuses = fleet.stop()
    except KeyboardInterrupt:
        fleet.kill()
        _say("interrupted again: killed every member")
        return INTERRUPTED
    failed = {name: code for name, code in statuses.items() if code not in (0, -signal.SIGKILL)}
    _say("stopped" + (f"; exit statuses: {failed}" if failed else "; every member exited cleanly"))
    return 0


def report(fleet: LocalFleet, stop: threading.Event) -> None:
    """Say where to look once the robots stream (or once the wait for them ends)."""
    if fleet.monitor is None:
        _say("ready — Ctrl-C to stop everything")
        return
    wanted = set(fleet.robot_names)
    deadline = time.monotonic() + STREAMING_WAIT_S
    while not stop.is_set() and wanted - fleet.streaming() and time.monotonic() < deadline:
        stop.wait(0.5)
    missing = sorted(wanted - fleet.streaming())
    if missing:
        _say(f"not streaming yet: {', '.join(missing)} (see their logs)")
    elif wanted:
        _say(f"{len(wanted)} robot(s) streaming")
    _say(f"monitor on {fleet.url} — Ctrl-C to stop everything")


def watch(fleet: LocalFleet, stop: threading.Event) -> None:
    """Until a signal: say once about each member that exits on its own."""
    gone: set[str] = set()
    while not stop.wait(1.0):
        for member in fleet.members:
            if member.name not in gone and not member.running():
                gone.add(member.name)
                _say(f"{member.name} exited with status {member.popen.returncode}; see {member.log_path}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``servo-fleet``."""
    args = build_parser().parse_args(argv)
    problem = check(args)
    if problem is not None:
        _say(f"error: {problem}")
        return 2
    return up(args)


if __name__ == "__main__":
    sys.exit(main())
