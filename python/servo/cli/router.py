"""``servo-router fleet.toml``: a Zenoh router whose access control comes from a fleet file.

Exit codes: 0 after Ctrl-C / SIGTERM (or a successful ``--check``), 1 when the router cannot
listen (the endpoint is named), 2 for a fleet file that cannot be used (the key is named), 130 on a
third Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import NoReturn

import anyio

from servo.cli.flags import HelpFormatter
from servo.cli.lifecycle import exit_process, on_signal, run_service
from servo.config import ConfigError
from servo.logs import configure_logging
from servo.router import Fleet, RouterReady, RouterStartError, access_control, load_fleet, run_router


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(prog="servo-router", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("fleet", help="path of the fleet file (TOML)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="validate the fleet file and print the generated access control (JSON) without starting",
    )
    parser.add_argument("--log-level", default="info", help="debug, info, warning, error")
    parser.add_argument("--json-logs", action="store_true", help="log JSON lines instead of console text")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an unexpected error")
    return parser


async def serve(fleet: Fleet) -> None:
    """Route until SIGINT/SIGTERM."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: on_signal(tg.cancel_scope.cancel, lambda: None, say=_say, what="still closing the router")
        )
        ready: RouterReady = await tg.start(run_router, fleet)
        _say(f"ready — {describe(fleet, ready)}; Ctrl-C to stop")


def describe(fleet: Fleet, ready: RouterReady | None = None) -> str:
    """One line: endpoints, how members are identified, identities per role."""
    how = "certificate common name" if fleet.identified_by == "cert_common_names" else "user name"
    roles = ", ".join(f"{role}: {fleet.count(role)}" for role in ("servers", "robots", "monitors", "routers"))
    where = f"listening on {', '.join(fleet.router.listen)}"
    if fleet.router.connect:
        where += f", joining {', '.join(fleet.router.connect)}"
    zid = f"router {ready.zid} " if ready is not None else ""
    return f"{zid}{where}; members named by {how}: {roles}; everything else denied"


def _say(text: str) -> None:
    print(f"servo-router: {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``servo-router``."""
    args = build_parser().parse_args(argv)
    try:
        fleet = load_fleet(args.fleet)
        if args.check:
            print(json.dumps(access_control(fleet), indent=2))
            _say(f"{args.fleet} is valid — {describe(fleet)}")
            return 0
        configure_logging(args.log_level, json=args.json_logs)
    except (ConfigError, ValueError) as exc:
        _say(f"error: {exc}")
        return 2
    return run_service(lambda: serve(fleet), say=_say, known={RouterStartError: 1}, debug=args.debug)


def script() -> NoReturn:
    """Console-script entry of ``servo-router``: `main`, then the process ends at once (`exit_process`)."""
    exit_process(main())


if __name__ == "__main__":
    script()
