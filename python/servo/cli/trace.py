"""``servo-trace --robot ID --at 14:03``: one robot's timeline, its edge's and its replicas' side.

Joined from its recordings
(``servo-edge --record``: every tick, the chunk each action came from, the fail-safe's transitions)
and the replicas' audit logs (``[ops] audit_log``: every request with its queue wait, inference
time and staleness), printed as one table in time order and, with ``--plot``, drawn as a PNG.

Exit codes: 0, or 2 when the inputs cannot be read or do not cover the time asked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from servo.cli.flags import HelpFormatter
from servo.recording import read_recording
from servo.trace import TraceError, build, parse_time, plot, read_audit, table
from servo.wire import WireError

PROG = "servo-trace"


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--robot", required=True, help="The robot's id (its client id, its certificate's CN).")
    when = parser.add_mutually_exclusive_group(required=True)
    when.add_argument("--at", help="Start of the window: HH:MM[:SS] (local time, the recording's day) or ISO 8601.")
    when.add_argument("--episode", type=int, help="One whole episode instead of a time window.")
    parser.add_argument("--window", type=float, default=60.0, help="Length of the window from --at (s) [60].")
    parser.add_argument(
        "--recording",
        action="append",
        required=True,
        metavar="FILE|DIR",
        help="The robot's recordings (servo-edge --record), or directories of *.servo files; repeatable.",
    )
    parser.add_argument(
        "--audit",
        action="append",
        default=[],
        metavar="FILE",
        help="A replica's audit log ([ops] audit_log); repeatable.",
    )
    parser.add_argument("--plot", metavar="FILE.png", help="Also draw the timeline into this PNG.")
    return parser


def recordings(items: list[str]) -> list[Path]:
    """Files as given, and the ``*.servo`` files of directories."""
    paths: list[Path] = []
    for item in items:
        path = Path(item)
        paths += sorted(path.glob("*.servo")) if path.is_dir() else [path]
    return paths


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``servo-trace``."""
    args = build_parser().parse_args(argv)
    try:
        files = recordings(args.recording)
        if not files:
            raise TraceError(f"--recording {' '.join(args.recording)}: no recording there")
        if args.window <= 0:
            raise TraceError(f"--window {args.window:g}: must be > 0")
        audit = read_audit(args.audit, args.robot)
        if args.at is not None:
            first = read_recording(files[0]).header.start_wall_ns
            start = parse_time(args.at, first)
            timeline = build(args.robot, files, audit, start_ns=start, end_ns=start + int(args.window * 1e9))
        else:
            timeline = build(args.robot, files, audit, episode=args.episode)
        sys.stdout.write(table(timeline))
        if args.plot:
            plot(timeline, args.plot)
            print(f"{PROG}: timeline drawn in {args.plot}", file=sys.stderr)
    except (TraceError, WireError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
