"""``servo-edge trust`` and ``servo-edge --identity``: what a robot trusts, and who it is.

``servo-edge trust [--app APP] [--model MODEL] [ed25519:… …]`` makes exactly the identities given
the trusted ones for that deployment in the known-servers file (`servo.client.known`): what to
run after a server was re-keyed on purpose, as the edge's refusal says. Without identities it
lists what the file trusts. ``servo-edge --identity`` prints this robot's fingerprint (created on
first use), the value a server enrols in ``[security] robots``.

Exit codes: 0 done, 2 a malformed identity, selector or file.
"""

from __future__ import annotations

import argparse

from servo.cli.console import Console
from servo.client import UntrustedServer
from servo.client.known import KnownServers, deployment
from servo.home import robot_identity_path
from servo.identity import IdentityError, robot_identity
from servo.wire import WireError, fingerprint, parse_fingerprint, segment

PROG = "servo-edge trust"


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``servo-edge trust``."""
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("identities", nargs="*", metavar="ed25519:…", help="The identities to trust (all others go).")
    parser.add_argument("--app", help="The deployment's app, as the edge's --app (any when omitted).")
    parser.add_argument("--model", help="The deployment's model, as the edge's --model (any when omitted).")
    parser.add_argument("--known-servers", metavar="FILE", help="The file (known_servers in servo's directory).")
    return parser


def main(argv: list[str], console: Console) -> int:
    """Run ``servo-edge trust``; the exit code."""
    args = build_parser().parse_args(argv)
    known = KnownServers(args.known_servers)
    try:
        for name in ("app", "model"):
            if getattr(args, name) is not None:
                segment(getattr(args, name), what=f"--{name}")
        selector = deployment(args.app, args.model)
        identities = [parse_fingerprint(text) for text in args.identities]
        if not identities:
            for known_selector, identity in known.entries():
                print(f"{known_selector} {fingerprint(identity)}")
            return 0
        known.replace(selector, identities)
    except (WireError, UntrustedServer, OSError) as exc:
        console.say(f"{PROG}: error: {exc}")
        return 2
    trusted = ", ".join(fingerprint(identity) for identity in identities)
    console.say(f"{PROG}: {selector} now trusts {trusted} ({known.path})")
    return 0


def show_identity(path: str, console: Console) -> int:
    """``servo-edge --identity``: print this robot's fingerprint (creating the identity); the exit code."""
    try:
        identity = robot_identity(path)
    except IdentityError as exc:
        console.say(f"servo-edge: error: {exc}")
        return 2
    print(fingerprint(identity.public_key))
    console.say(
        f"servo-edge: robot identity kept in {path or robot_identity_path()}; a server enrols this robot with "
        '[security] robots = [{name = "<client id>", identity = "' + fingerprint(identity.public_key) + '"}]'
    )
    return 0
