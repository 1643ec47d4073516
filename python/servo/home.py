"""Where servo keeps what a user's machine must remember: identities and trusted servers.

One directory per user, chosen like other XDG tools choose theirs:

1. ``$SERVO_CONFIG_DIR`` when set (tests, several robots on one machine, a service account);
2. else ``$XDG_CONFIG_HOME/servo`` when ``XDG_CONFIG_HOME`` is set;
3. else ``~/.config/servo``.

What lives there (each created on first use, the directory with mode 0700):

* ``robot.key``: this machine's robot identity (`servo.identity`), created by the first
  ``servo-edge`` run; ``servo-edge --identity`` prints its fingerprint.
* ``servers/<app>.key``: the identity of the servers of app ``<app>`` that ``servo-serve``
  runs here (one per app, so replicas started from this directory share it).
* ``known_servers``: the servers edges trusted on first use (`servo.client.known`).
* ``monitor.key``: this machine's operator identity (`servo.identity`), created by the first
  ``servo-monitor`` run; ``servo-monitor --identity`` prints its fingerprint, which servers list
  as an operator (``[security] operators``) to show it the fleet's audit trail and robots encrypt
  their telemetry to.
* ``telemetry.run``: how many times an edge of this machine ran (its telemetry's run counter, so
  a monitor can refuse a replayed record of an old run).
* ``monitor.state``: what a monitor remembers of each robot's telemetry runs across restarts
  (`servo.monitor.trust`), so a replayed record of an old run is refused.
* ``tls/server.pem``, ``tls/server.key``: the self-signed certificate ``servo-serve`` listens
  with on a ``tls/…`` endpoint that names none (`servo.server.selfsigned`).
* ``servers/<app>.roster``: the robots that joined ``servo-serve``'s servers of ``<app>`` with a
  token, the join tokens (only their verification keys) and the openpi API keys (only their
  hashes) (`servo.server.roster`).
* ``tls/pinned/<hash>.pem``: server certificates a robot fetched when it joined with a token
  that pins them (`servo.client.join`).

The directory and everything in it must be this user's alone (`servo.private_files`): a
directory others may write, a file of another user or a symbolic link is refused in one line
saying what to fix.

Nothing here reads the directory at import time: every function looks at the environment when
it is called, so a test (or a process) may point ``SERVO_CONFIG_DIR`` elsewhere at any time.
"""

from __future__ import annotations

import os
from pathlib import Path

from servo.private_files import private_dir

#: The environment variable that names the directory outright.
CONFIG_DIR_VARIABLE = "SERVO_CONFIG_DIR"


def config_dir() -> Path:
    """The user's servo directory (not created: see `ensure_config_dir`)."""
    explicit = os.environ.get(CONFIG_DIR_VARIABLE)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME")
    if xdg:
        return Path(xdg).expanduser() / "servo"
    return Path.home() / ".config" / "servo"


def ensure_config_dir() -> Path:
    """`config_dir`, created with mode 0700 when missing, and checked to be this user's alone.

    Raises:
        PrivateFileError: the directory cannot be created, or others may write it.
    """
    return private_dir(config_dir())


def robot_identity_path() -> Path:
    """Where this machine's robot identity lives by default."""
    return config_dir() / "robot.key"


def server_identity_path(app: str) -> Path:
    """Where the identity of this machine's servers of ``app`` (a key segment) lives by default."""
    return config_dir() / "servers" / f"{app}.key"


def known_servers_path() -> Path:
    """The edges' trust-on-first-use record (`servo.client.known`)."""
    return config_dir() / "known_servers"


def telemetry_run_path() -> Path:
    """Where a robot counts its runs (what its telemetry's ``run`` says: `servo.edge.telemetry`)."""
    return config_dir() / "telemetry.run"


def operator_identity_path() -> Path:
    """Where this machine's operator (monitor) identity lives by default."""
    return config_dir() / "monitor.key"


def monitor_state_path() -> Path:
    """Where a monitor keeps the telemetry runs it saw (`servo.monitor.trust`)."""
    return config_dir() / "monitor.state"


def roster_path(app: str) -> Path:
    """Where the servers of ``app`` (a key segment) keep the robots that joined with a token."""
    return config_dir() / "servers" / f"{app}.roster"


def pinned_certificates_dir() -> Path:
    """Where a robot keeps the server certificates its join tokens pinned."""
    return config_dir() / "tls" / "pinned"
