"""``servo-serve robots …``: the robots a server admits, its join tokens and openpi API keys.

Works on the server's roster (`servo.server.roster`: ``servers/<app>.roster`` in servo's
directory, or the file ``[security] roster`` names), never edited by hand; a running server
notices every change within about a second (a revoked robot's sessions close, a new token works):

    servo-serve robots list                       enrolled robots, join tokens, API keys
    servo-serve robots token [--ttl 1h] [--uses N] [--name ROBOT]
                                                  a join token, and the robot's command with it
    servo-serve robots revoke NAME                a robot that joined is no longer admitted
    servo-serve robots revoke-token ID            a join token can no longer be used
    servo-serve robots api-key NAME [--ttl D]     an openpi API key, printed once (kept hashed)
    servo-serve robots revoke-key NAME            an openpi API key is no longer accepted

``--manifest FILE`` (or ``--app`` and ``--roster``) says which server. Robots the manifest or
its fleet file enrol are changed there, not here. Exit codes: 0 done, 2 a refused value or an
unusable file (one line).
"""

from __future__ import annotations

import argparse
import re
import secrets
import time
from datetime import datetime

import msgspec

from servo.access import API_KEY_PREFIX, hash_api_key
from servo.cli.console import Console
from servo.cli.flags import HelpFormatter
from servo.cli.listen import edge_command
from servo.config import ConfigError
from servo.home import roster_path
from servo.identity import IdentityError
from servo.join import JoinToken, new_token_id
from servo.server.joins import issue, revoke_robot, revoke_token
from servo.server.manifest import load_manifest
from servo.server.roster import Roster, RosterApiKey, RosterError, RosterFile
from servo.wire import WireError, fingerprint, segment

PROG = "servo-serve robots"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?")
_UNITS = {None: 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def duration(text: str) -> float:
    """Seconds of ``90s``, ``30m``, ``1h``, ``2d`` or a plain number of seconds (positive)."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"expected a duration like 90s, 30m, 1h or 2d, got {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``servo-serve robots``."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--manifest", metavar="FILE", help="The server's manifest: its app, roster and identity.")
    parser.add_argument("--app", help="The server's app (serving.app) when no manifest is given [default: default].")
    parser.add_argument("--roster", metavar="FILE", help="The roster file (servers/<app>.roster in servo's directory).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("list", help="Enrolled robots, join tokens and API keys.")
    token = commands.add_parser("token", help="Issue a join token and print the robot's command.")
    token.add_argument("--ttl", type=duration, default=3600.0, help="How long it is valid (e.g. 1h) [default: 1h].")
    token.add_argument("--uses", type=_positive, default=1, help="How many robots may join with it [default: 1].")
    token.add_argument("--name", help="Only the robot with this client id may use it (its command says --client-id).")
    revoke = commands.add_parser("revoke", help="Stop admitting a robot that joined (its sessions close).")
    revoke.add_argument("name", help="The robot's name (client id).")
    revoke_tok = commands.add_parser("revoke-token", help="Revoke a join token.")
    revoke_tok.add_argument("id", help="The token's id (servo-serve robots list).")
    api = commands.add_parser("api-key", help="Make an openpi API key for NAME (printed once, kept hashed).")
    api.add_argument("name", help="Who holds it (named in logs and the audit log).")
    api.add_argument("--ttl", type=duration, default=None, help="Expire it after this long [default: never].")
    revoke_key = commands.add_parser("revoke-key", help="Stop accepting an openpi API key.")
    revoke_key.add_argument("name", help="Its holder's name.")
    return parser


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


class _Server(msgspec.Struct, frozen=True):
    roster: Roster
    app: str
    identity_key: str
    ephemeral: bool


def _server(args: argparse.Namespace) -> _Server:
    if args.manifest is None:
        app = args.app or "default"
        segment(app, what="--app")
        return _Server(Roster(args.roster or roster_path(app)), app, "", False)
    manifest = load_manifest(args.manifest)
    app, security = manifest.serving.app, manifest.security
    roster = Roster(args.roster or security.roster or roster_path(app))
    return _Server(roster, app, security.identity_key, security.ephemeral_identity)


def main(argv: list[str], console: Console) -> int:
    """Run ``servo-serve robots``; the exit code."""
    args = build_parser().parse_args(argv)
    try:
        server = _server(args)
        return _COMMANDS[args.command](args, server, console)
    except (ConfigError, RosterError, IdentityError, WireError) as exc:
        console.say(f"{PROG}: error: {exc}")
        return 2


def _list(args: argparse.Namespace, server: _Server, console: Console) -> int:
    file, now = server.roster.read(), time.time()
    print(f"roster {server.roster.path}")
    print(f"robots ({len(file.robots)}):" if file.robots else "robots: none joined")
    for robot in file.robots:
        how = f"token {robot.token}" if robot.token else "by hand"
        print(f"  {robot.name}  {robot.identity}  joined {_when(robot.joined)} ({how})")
    print(f"join tokens ({len(file.tokens)}):" if file.tokens else "join tokens: none")
    for token in file.tokens:
        state = token.problem(now) or f"usable by {token.uses} more robot(s) until {_when(token.expires)}"
        only = f", only for {token.name!r}" if token.name else ""
        print(f"  {token.id}  {state}{only}")
    print(f"openpi API keys ({len(file.api_keys)}):" if file.api_keys else "openpi API keys: none")
    for key in file.api_keys:
        ends = f"expires {_when(key.expires)}" if key.expires else "never expires"
        print(f"  {key.name}  id {key.id}  made {_when(key.created)}, {ends}")
    return 0


def _token(args: argparse.Namespace, server: _Server, console: Console) -> int:
    if server.ephemeral:
        raise ConfigError("security.ephemeral_identity: a join token pins the server's identity, which this one renews")
    from servo.identity import server_identity

    identity = server_identity(server.identity_key, server.app)
    if args.name is not None:
        segment(args.name, what="--name")
    advertised = server.roster.read().server
    own = advertised is not None and advertised.identity == fingerprint(identity.public_key)
    pin = bytes.fromhex(advertised.certificate) if own and advertised is not None else b""
    token = server.roster.change(
        lambda f: issue(
            f,
            JoinToken.issue(identity.public_key, pin),
            ttl_s=args.ttl,
            uses=args.uses,
            name=args.name or "",
            now=time.time(),
        )
    )
    robots = "one robot" if args.uses == 1 else f"{args.uses} robots"
    console.say(f"{PROG}: join token {token.id} for {robots}, valid until {_when(time.time() + args.ttl)}")
    name = args.name or ""
    listen = advertised.listen if own and advertised is not None else []
    command = (
        edge_command(listen[0], robot="ROBOT", certificate=None, join=str(token), client_id=name) if listen else None
    )
    named = f" --client-id {name}" if name else ""
    print(command or f"servo-edge --robot ROBOT{named} --connect ENDPOINT --join {token}")
    return 0


def _revoke(args: argparse.Namespace, server: _Server, console: Console) -> int:
    if not server.roster.change(lambda f: revoke_robot(f, args.name)):
        raise ConfigError(f"{args.name!r}: no robot of that name joined this server (servo-serve robots list)")
    console.say(f"{PROG}: {args.name!r} is no longer admitted; its sessions close within a second")
    return 0


def _revoke_token(args: argparse.Namespace, server: _Server, console: Console) -> int:
    if not server.roster.change(lambda f: revoke_token(f, args.id)):
        raise ConfigError(f"{args.id!r}: no join token with that id (servo-serve robots list)")
    console.say(f"{PROG}: join token {args.id} revoked")
    return 0


def _api_key(args: argparse.Namespace, server: _Server, console: Console) -> int:
    segment(args.name, what="api-key NAME")
    key_id = new_token_id()
    text = f"{API_KEY_PREFIX}.{key_id}.{secrets.token_urlsafe(24)}"
    now = time.time()
    kept = RosterApiKey(
        key_id, args.name, hash_api_key(text).hex(), created=now, expires=now + args.ttl if args.ttl else 0.0
    )

    def add(file: RosterFile) -> tuple[RosterFile, bool]:
        if any(k.name == args.name for k in file.api_keys):
            return file, False
        return msgspec.structs.replace(file, api_keys=[*file.api_keys, kept]), True

    if not server.roster.change(add):
        raise ConfigError(f"{args.name!r} holds an API key already (revoke-key it first)")
    console.say(f"{PROG}: openpi API key of {args.name!r} (shown once; the server keeps only its hash):")
    print(text)
    return 0


def _revoke_key(args: argparse.Namespace, server: _Server, console: Console) -> int:
    def drop(file: RosterFile) -> tuple[RosterFile, bool]:
        keys = [k for k in file.api_keys if k.name != args.name]
        return msgspec.structs.replace(file, api_keys=keys), len(keys) != len(file.api_keys)

    if not server.roster.change(drop):
        raise ConfigError(f"{args.name!r}: holds no API key (servo-serve robots list)")
    console.say(f"{PROG}: the API key of {args.name!r} is no longer accepted")
    return 0


def _when(unix: float) -> str:
    return datetime.fromtimestamp(unix).strftime("%Y-%m-%d %H:%M:%S") if unix else "-"


_COMMANDS = {
    "list": _list,
    "token": _token,
    "revoke": _revoke,
    "revoke-token": _revoke_token,
    "api-key": _api_key,
    "revoke-key": _revoke_key,
}
