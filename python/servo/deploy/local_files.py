"""The files of a local fleet (`servo.deploy.local`): fleet file, credentials, manifest, robot homes.

Written into one directory, every path absolute so each member runs from anywhere::

    fleet.toml          servo-router's fleet file: who may join, in which role, and every member's
                        identity: robots enrolled, the replicas' and the monitor's known
    passwords           the router's name:password lines (mode 0600)
    secrets/<member>    each member's own password (mode 0600), what it logs in with
    manifest.toml       the replicas' manifest (the reference policy; joins with servo-serve flags)
    replicas/           the replicas' servo directory: their shared identity (server.key)
    robots/<robot>/     each robot's servo directory: its identity, enrolled in fleet.toml
    monitor.key         the monitor's operator identity: the replicas show it the fleet's audit
                        trail and name it to their robots, which encrypt their telemetry to it
    robot-keys          the robots' fingerprints, pinned by the monitor
    logs/<member>.log   what each process printed (and each robot's run summary, <robot>.summary.json)

Members log in with a user name and password over TCP on 127.0.0.1: nothing leaves the host. The
monitor reads the fleet file too: it believes the replicas by their identity and the robots by
theirs, nobody who merely speaks first.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from servo.identity import load_identity
from servo.wire import fingerprint

#: The router's user name of every replica (one Deployment, one credential, like a pod's Secret).
REPLICAS_USER = "replicas"
MONITOR_USER = "monitor"
#: The app the replicas serve (the first key segment after ``@servo``).
APP = "fleet"


@dataclass(frozen=True)
class FleetFiles:
    """Where the files of a local fleet are (see the module docstring)."""

    directory: Path

    @property
    def fleet(self) -> Path:
        """servo-router's fleet file."""
        return self.directory / "fleet.toml"

    @property
    def manifest(self) -> Path:
        """The replicas' manifest."""
        return self.directory / "manifest.toml"

    @property
    def servers_home(self) -> Path:
        """The replicas' servo directory."""
        return self.directory / "replicas"

    @property
    def server_key(self) -> Path:
        """The replicas' shared identity."""
        return self.servers_home / "server.key"

    @property
    def monitor_key(self) -> Path:
        """The monitor's operator identity."""
        return self.directory / "monitor.key"

    @property
    def robot_keys(self) -> Path:
        """The robots' pinned fingerprints, for the monitor."""
        return self.directory / "robot-keys"

    def secret(self, member: str) -> Path:
        """The file holding ``member``'s password."""
        return self.directory / "secrets" / member

    def robot_home(self, robot: str) -> Path:
        """The servo directory of ``robot``."""
        return self.directory / "robots" / robot

    def summary(self, robot: str) -> Path:
        """Where ``robot`` writes its run summary when it stops."""
        return self.directory / "logs" / f"{robot}.summary.json"

    def log(self, member: str) -> Path:
        """Where ``member``'s output goes."""
        return self.directory / "logs" / f"{member}.log"


def write_fleet_files(directory: Path, *, router_port: int, robots: list[str]) -> FleetFiles:
    """Create every file of a fleet of ``robots`` whose router listens on ``router_port``.

    Raises:
        OSError: the directory cannot be written.
        IdentityError: an identity cannot be created.
    """
    files = FleetFiles(directory)
    for sub in ("secrets", "logs", "replicas", "robots"):
        (directory / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
    passwords = {name: secrets.token_urlsafe(24) for name in [REPLICAS_USER, MONITOR_USER, *robots]}
    for name, password in passwords.items():
        _private(files.secret(name), f"{password}\n")
    _private(directory / "passwords", "".join(f"{name}:{password}\n" for name, password in passwords.items()))
    identities = {}
    for robot in robots:
        files.robot_home(robot).mkdir(mode=0o700, exist_ok=True)
        key = load_identity(files.robot_home(robot) / "robot.key", role="robot").public_key
        identities[robot] = fingerprint(key)
    files.robot_keys.write_text("".join(f"{robot} {print_}\n" for robot, print_ in identities.items()))
    enrolled = ", ".join(f'{robot} = "{print_}"' for robot, print_ in identities.items())
    robot_group = f"[[robots]]\nnames = {robots!r}\nidentities = {{{enrolled}}}\n" if robots else ""
    server = fingerprint(load_identity(files.server_key, role="server").public_key)
    monitor = fingerprint(load_identity(files.monitor_key, role="operator").public_key)
    files.fleet.write_text(
        f"""# servo-fleet: who may join the router, and as what (servo-router reads it; replicas enrol [[robots]])
[router]
listen = ["tcp/127.0.0.1:{router_port}"]
passwords_file = "passwords"

[[servers]]
names = ["{REPLICAS_USER}"]
identities = {{{REPLICAS_USER} = "{server}"}}

{robot_group}
[[monitors]]
names = ["{MONITOR_USER}"]
identities = {{{MONITOR_USER} = "{monitor}"}}
"""
    )
    files.manifest.write_text(
        f"""# servo-fleet: the replicas' manifest; each joins the router with servo-serve --connect --replica
[model]
source = "reference"
warmup = 1

[model.options]
cameras = {{front = [48, 64]}}
chunk_size = 20

[serving]
app = "{APP}"

[zenoh.auth]
user = "{REPLICAS_USER}"
password_file = "{files.secret(REPLICAS_USER)}"

[security]
identity_key = "{files.server_key}"
fleet = "{files.fleet}"
"""
    )
    return files


def _private(path: Path, text: str) -> None:
    """Write ``text`` to a new file only its owner may read."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
