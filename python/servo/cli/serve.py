"""``servo-serve manifest.toml``: load, warm and serve one policy until Ctrl-C / SIGTERM.

``servo-serve --lerobot PATH --listen tls/0.0.0.0:7447 --device cuda`` serves a LeRobot checkpoint
folder without a manifest: fps, names, units and cameras are read from it. A ``tls/…`` listen with
no certificate configured gets servo's self-signed one for this host. Once ready, the server says
how many robots it carries at this fps (a capacity plan from the warm-up forwards, with a warning
when a forward outlasts a chunk) and prints the ``servo-edge`` commands that reach it.

Reachable off loopback, it admits only enrolled robots: it prints a join token in the robot's
command (``servo-edge … --join TOKEN``), and ``servo-serve robots …`` lists and revokes robots and
makes more tokens and openpi API keys (``servo-serve robots --help``).

With ``--ray``, start ``--replicas`` servers of the manifest as actors on an existing Ray cluster
instead, print one line per replica as it becomes ready (again after Ray restarts it), drain and
restart them one at a time on SIGHUP (a rolling restart), and drain them all on Ctrl-C / SIGTERM.

Exit codes: 0 after a clean drain, 1 when the network or a port is unusable, 2 for a manifest or
policy problem (one line naming the key), 130 when a third Ctrl-C cut the drain short.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import anyio
from anyio.abc import TaskStatus

from servo.cli.console import Console
from servo.cli.flags import HelpFormatter
from servo.cli.lerobot import OPTION_FLAGS, lerobot_manifest
from servo.cli.lifecycle import INTERRUPTED, exit_process, first_error, on_signal
from servo.cli.listen import secure_listen
from servo.cli.notify import notify_server, stopping
from servo.cli.ports import PortInUseError, free_ports_advice, refuse_busy
from servo.cli.ray_supervision import RAY_FLAGS, serve_on_ray
from servo.cli.ready import ready_lines
from servo.config import ConfigError
from servo.logs import configure_logging
from servo.server.manifest import Manifest, load_manifest
from servo.systemd import Notifier

if TYPE_CHECKING:
    from servo.server.selfsigned import ServerCertificate
    from servo.server.service import ServerReady

PROG = "servo-serve"
#: Subcommands dispatched before the server's own parser: name -> the module with their
#: ``main(argv, console)`` and ``build_parser()`` (the CLI reference documents them from it).
SUBCOMMANDS = {"robots": "servo.cli.robots"}
SERVER_EXTRA = "pip install 'servo-robotics[server]'"
RAY_EXTRA = "pip install 'servo-robotics[ray]'"
#: What the server extra brings; the edge and the client library never import them.
SERVER_DEPENDENCIES = frozenset({"torch", "prometheus_client", "cryptography"})
#: What a frontend needs beyond the server extra, imported only when the manifest configures it.
FRONTEND_DEPENDENCIES = {"websockets": ("the openpi front door", "pip install 'servo-robotics[openpi]'")}
#: The flag that moves each port servo-serve listens on (its manifest key -> flag).
PORT_FLAGS = {
    "zenoh.listen": "--listen",
    "ops.health_port": "--health-port",
    "frontends.openpi.listen": "--openpi-listen",
}


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("manifest", nargs="?", help="Path of the server manifest (TOML); see examples/manifest.toml.")
    parser.add_argument(
        "--lerobot",
        metavar="PATH",
        help="Serve this LeRobot checkpoint folder (or cached hub id) without a manifest; fps, names, units and "
        "cameras are read from it.",
    )
    parser.add_argument("--device", metavar="DEVICE", help="Replace model.device: cpu, cuda, cuda:N or mps.")
    parser.add_argument("--task", metavar="TEXT", help="Replace serving.default_task (a VLA's instruction).")
    parser.add_argument(
        "--max-sessions", type=int, metavar="N", help="Replace serving.max_sessions (see the capacity plan)."
    )
    parser.add_argument("--fps", type=float, metavar="HZ", help="With --lerobot: the rate it was trained at.")
    parser.add_argument("--units", metavar="UNITS", help="With --lerobot: its joint units, degrees or range_m100_100.")
    parser.add_argument(
        "--action-names",
        metavar="NAMES",
        help="With --lerobot: its action names in order, comma-separated (when its training dataset is not at hand).",
    )
    parser.add_argument(
        "--listen",
        action="append",
        metavar="ENDPOINT",
        help="Replace zenoh.listen (repeatable), e.g. tls/0.0.0.0:7447 (a self-signed certificate is made for it).",
    )
    parser.add_argument(
        "--connect",
        action="append",
        metavar="ENDPOINT",
        help="Join the router at ENDPOINT as its client (repeatable): replaces zenoh.connect, sets zenoh.mode to "
        "client and, unless --listen is given, zenoh.listen to none (a server behind a router listens nowhere else).",
    )
    parser.add_argument(
        "--replica",
        metavar="NAME",
        help="Replace serving.replica: this replica's name in its keys (default: host name and pid), e.g. a pod's.",
    )
    parser.add_argument("--health-port", type=int, metavar="PORT", help="Replace ops.health_port (0 disables).")
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="Allow a plain tcp/ listen endpoint on a non-loopback address ([security] insecure): anyone on the "
        "network then reads every robot's observations and chunks.",
    )
    parser.add_argument(
        "--listen-beside-router",
        action="store_true",
        help="Allow listening, or peer mode, while connected to a router ([security] listen_beside_router): peers "
        "reaching the listen endpoint, or linked to by gossip, bypass the router's access control.",
    )
    parser.add_argument(
        "--allow-any-robot",
        action="store_true",
        help="Admit robots nobody enrolled (and openpi clients without an API key) although the server is reachable "
        "off loopback ([security] allow_any_robot): anyone who reaches it may open sessions and take capacity.",
    )
    parser.add_argument(
        "--expose-health",
        action="store_true",
        help="Allow ops.health_host off loopback ([security] expose_health): anyone on the network reads /metrics "
        "(robot names, request rates).",
    )
    parser.add_argument(
        "--openpi-listen", metavar="HOST:PORT", help="Replace frontends.openpi.listen (starts the openpi front door)."
    )
    parser.add_argument("--log-level", default="info", help="debug, info, warning or error.")
    parser.add_argument("--json-logs", action="store_true", help="Log JSON lines instead of console text.")
    parser.add_argument("--debug", action="store_true", help="Show the traceback of an error.")
    ray = parser.add_argument_group("deployment on Ray", f"Needs {RAY_EXTRA}.")
    ray.add_argument("--ray", action="store_true", help="Start the servers as actors on an existing Ray cluster.")
    ray.add_argument("--ray-address", metavar="ADDR", help="Ray cluster: auto (default) or the head's host:port.")
    ray.add_argument("--replicas", type=int, metavar="N", help="Number of servers (default 1).")
    ray.add_argument("--ray-num-cpus", type=float, metavar="CPUS", help="CPUs Ray reserves per replica (default 1).")
    ray.add_argument(
        "--ray-max-restarts", type=int, metavar="N", help="Restarts of a dead replica (default -1: no limit)."
    )
    return parser


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Manifest keys replaced by flags (checked by the same rules as the file)."""
    out: dict[str, Any] = {}
    if args.connect:
        out |= {"zenoh.connect": list(args.connect), "zenoh.mode": "client", "zenoh.listen": []}
    if args.listen:
        out["zenoh.listen"] = list(args.listen)
    if args.replica is not None:
        out["serving.replica"] = args.replica
    if args.health_port is not None:
        out["ops.health_port"] = args.health_port
    if args.openpi_listen is not None:
        out["frontends.openpi.listen"] = args.openpi_listen
    if args.device is not None:
        out["model.device"] = args.device
    if args.task is not None:
        out["serving.default_task"] = args.task
    if args.max_sessions is not None:
        out["serving.max_sessions"] = args.max_sessions
    if args.insecure:
        out["security.insecure"] = True
    if args.listen_beside_router:
        out["security.listen_beside_router"] = True
    if args.allow_any_robot:
        out["security.allow_any_robot"] = True
    if args.expose_health:
        out["security.expose_health"] = True
    return out


def read_manifest(args: argparse.Namespace) -> Manifest:
    """The manifest file with the flags in place, or the one ``--lerobot PATH`` makes.

    Raises:
        ConfigError: neither or both given, a ``--lerobot`` flag without it, or a refused value.
    """
    if (args.manifest is None) == (args.lerobot is None):
        raise ConfigError("give a manifest file or --lerobot PATH (one of them)")
    flags = {name: getattr(args, name) for name in OPTION_FLAGS}
    if args.lerobot is None:
        if given := [f"--{name}" for name, value in flags.items() if value is not None]:
            raise ConfigError(f"{', '.join(given)} need --lerobot (a manifest sets them in [model.options])")
        return load_manifest(args.manifest, overrides=overrides(args))
    return lerobot_manifest(args.lerobot, flags, overrides(args))


async def serve(
    manifest: Manifest, base_dir: Path, console: Console, certificate: ServerCertificate | None = None
) -> None:
    """Run the server until drained by a signal; ``certificate``: the self-signed one it listens with."""
    from servo.frontends import frontends_of
    from servo.server.service import PolicyServer

    def say(text: str) -> None:
        console.say(f"{PROG}: {text}")

    server = PolicyServer(manifest, frontends=frontends_of(manifest), search_path=base_dir)
    notifier = Notifier.from_environment()
    async with anyio.create_task_group() as tg:

        async def run_server(*, task_status: TaskStatus[ServerReady]) -> None:
            await server.run(task_status=task_status)
            tg.cancel_scope.cancel()

        drain = stopping(notifier, server.drain)
        tg.start_soon(lambda: on_signal(drain, server.hurry, say=say, what="not waiting for the request in flight"))
        model = manifest.model
        say(f"loading {model.source} on {model.device}, {model.warmup} warm-up forward(s)…")
        ready: ServerReady = await tg.start(run_server)
        for line in ready_lines(ready, manifest, certificate):
            say(line)
        say("ready — Ctrl-C to drain and stop")
        if notifier is not None:
            tg.start_soon(notify_server, notifier, server, ready)


def classify(exc: BaseException) -> tuple[int, str] | None:
    """Exit code and one-line message of an error that ends the server, or None if unexpected."""
    import zenoh

    from servo.deploy import DeployError
    from servo.identity import IdentityError
    from servo.policy import PolicyLoadError
    from servo.private_files import PrivateFileError
    from servo.server.selfsigned import CertificateFileError

    if isinstance(exc, ConfigError | PolicyLoadError | IdentityError | CertificateFileError | PrivateFileError):
        return 2, str(exc)
    if isinstance(exc, ModuleNotFoundError) and exc.name == "ray":
        return 2, f"--ray needs Ray, which is not installed: {RAY_EXTRA}"
    if isinstance(exc, DeployError):
        return 1, str(exc)
    if isinstance(exc, PortInUseError):
        flags = free_ports_advice(exc, PORT_FLAGS)
        return 2, f"{exc} (another servo-serve?); stop it, or choose free ports: {flags}"
    if isinstance(exc, ModuleNotFoundError) and exc.name in SERVER_DEPENDENCIES:
        return 2, f"serving needs {exc.name}, which is not installed: {SERVER_EXTRA}"
    if isinstance(exc, ModuleNotFoundError) and exc.name in FRONTEND_DEPENDENCIES:
        what, extra = FRONTEND_DEPENDENCIES[exc.name]
        return 2, f"{what} needs {exc.name}, which is not installed: {extra}"
    if isinstance(exc, zenoh.ZError):
        from servo.transport import zenoh_message

        return 1, f"zenoh: {zenoh_message(exc)}"
    if isinstance(exc, OSError):
        return 1, str(exc)
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED, "interrupted"
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``servo-serve``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in SUBCOMMANDS:
        return int(importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:], Console(live=False)))
    args = build_parser().parse_args(argv)
    console = Console(live=False)
    configure_logging(args.log_level, json=args.json_logs, stream=console)
    try:
        manifest = read_manifest(args)
        if args.ray:
            code = serve_on_ray(manifest, args, console)
            if code:
                return code
        else:
            if given := [f"--{flag.replace('_', '-')}" for flag in RAY_FLAGS if getattr(args, flag) is not None]:
                raise ConfigError(f"{', '.join(given)} need --ray")
            manifest, certificate = secure_listen(manifest)
            openpi = manifest.frontends.openpi
            refuse_busy(
                manifest.zenoh.listen_endpoints(),
                manifest.ops.health_host,
                manifest.ops.health_port,
                others=[] if openpi is None else [("frontends.openpi.listen", openpi.host, openpi.port)],
            )
            anyio.run(
                serve,
                manifest,
                Path(args.manifest).resolve().parent if args.manifest else Path.cwd(),
                console,
                certificate,
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


def script() -> NoReturn:
    """Console-script entry of ``servo-serve``: `main`, then the process ends at once (`exit_process`)."""
    exit_process(main())


if __name__ == "__main__":
    script()
