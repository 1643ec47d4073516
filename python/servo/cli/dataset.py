"""``servo-dataset export REC.servo… --root DIR --repo-id local/name``: recordings -> LeRobotDataset."""

from __future__ import annotations

import argparse
import sys

from servo.cli.flags import HelpFormatter
from servo.logs import configure_logging


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(prog="servo-dataset", description=__doc__, formatter_class=HelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser(
        "export",
        formatter_class=HelpFormatter,
        help="write recordings (one episode each) as a new LeRobotDataset (v3)",
        description="Write .servo recordings, one episode each, as a new LeRobotDataset (v3) that "
        "LeRobot can train on. Needs servo-robotics[lerobot] (Python >= 3.12).",
    )
    export.add_argument("recordings", nargs="+", metavar="REC.servo", help="recordings made with servo-edge --record")
    export.add_argument("--root", required=True, help="dataset directory to create (must not exist)")
    export.add_argument("--repo-id", required=True, help="dataset id stored in its metadata, e.g. local/so100_sweep")
    export.add_argument("--task", default="", help="task of every episode (default: the task each recording ran with)")
    export.add_argument("--images", action="store_true", help="store camera frames as PNG files instead of MP4 videos")
    export.add_argument("--log-level", default="warning", help="debug, info, warning, error")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``servo-dataset``: 0 on success, 2 when the recordings cannot be exported."""
    from servo.lerobot_dataset import ExportError, export_recordings

    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    try:
        summary = export_recordings(
            args.recordings, root=args.root, repo_id=args.repo_id, task=args.task, use_videos=not args.images
        )
    except ExportError as exc:
        print(f"servo-dataset: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"servo-dataset: wrote {summary.episodes} episode(s), {summary.frames} frames to {summary.root} "
        f"({summary.repo_id}; tasks: {', '.join(sorted(set(summary.tasks)))}; "
        f"cameras: {', '.join(summary.cameras) or 'none'})",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
