"""Whom a monitor believes: which key signs a robot's telemetry, which replicas speak, which records are replays.

* **Robots** are known by their enrolment, never by who speaks first: the keys a ``--robot-keys``
  file pins (``<robot> ed25519:<fingerprint>`` lines), the ``[[robots]]`` identities of a
  ``--fleet`` file, and the enrolled robots a trusted replica's signed audit answer lists
  (`learn_roster`). A record of a robot nobody enrolled is refused (``unknown_robot``) before any
  signature is checked, and nothing of it is remembered; one signed by another key than the
  enrolled one is refused (``identity_changed``). Only with ``trust_first_use`` is an unknown
  robot's first key believed (like ssh), for at most ``max_robots`` such robots: invented names
  cannot push an enrolled robot out, which always has its place.
* **Replicas** are believed when their identity is pinned (``--trusted-servers`` or the fleet
  file's ``[[servers]]`` identities), or, with ``trust_first_use``, the first identity seen for
  that replica's key prefix.
* **Replays**: records count up (``seq``) within a run, and runs count up (``run``) across the
  robot's restarts. A record is fresh when its run is newer than the last one seen of that
  robot, or it is of that run and later than the last record. What was seen is kept in a state
  file (``monitor.state`` in servo's directory), so a restarted monitor refuses a replay of an
  old run too.

Any thread may ask nothing here: it is owned by the monitor's event loop; `save` writes the state
file as servo writes its keys and pins (`servo.private_files`: atomically, never through a link,
this user's alone), and a state file others could have written is refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from servo.errors import SecurityError
from servo.private_files import PrivateFileError, read_private, write_private
from servo.wire import WireError, fingerprint, parse_fingerprint, segment

#: Versions of the state file this monitor reads.
_STATE_VERSION = 1


class TrustError(SecurityError, ValueError):
    """The pins or state file cannot be used; the message names the file and the line."""


def load_pins(path: str | Path) -> dict[str, bytes]:
    """The robots' pinned keys: ``<robot> ed25519:…`` per line, ``#`` comments and blank lines ignored.

    Raises:
        TrustError: unreadable, or a line that is not a robot id and a fingerprint.
    """
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TrustError(f"{path}: cannot read the robot keys: {getattr(exc, 'strerror', None) or exc}") from None
    pins: dict[str, bytes] = {}
    for number, line in enumerate(lines, start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        try:
            if len(words) != 2:
                raise WireError("expected '<robot> ed25519:<fingerprint>'")
            pins[segment(words[0], what="robot id")] = parse_fingerprint(words[1])
        except WireError as exc:
            raise TrustError(f"{path} line {number}: {exc}") from None
    return pins


@dataclass
class _Run:
    """The newest record seen of one robot: its run and seq."""

    run: int
    seq: int


class RobotTrust:
    """Keys, replicas and replay state of a monitor. Owned by the monitor's event loop.

    Args:
        pins: Keys that alone may sign for their robot (a robot keys file, a fleet file).
        servers: Identities whose replicas are believed.
        max_robots: Most robots (and replicas) trusted on first use.
        trust_first_use: Believe the first key of a robot nobody enrolled, and the first identity
            of a replica nobody pinned.
        state: The state file (None: kept in memory only).
    """

    def __init__(
        self,
        pins: Mapping[str, bytes] | None = None,
        *,
        servers: frozenset[bytes] = frozenset(),
        max_robots: int = 4096,
        trust_first_use: bool = False,
        state: Path | None = None,
    ) -> None:
        self._pins = dict(pins or {})
        self._rosters: dict[str, bytes] = {}
        self._servers = servers
        self._max_robots = max_robots
        self._first_use = trust_first_use
        self._state = state
        self._first_keys: dict[str, bytes] = {}
        self._first_servers: dict[str, bytes] = {}
        self._runs: dict[str, _Run] = {}
        self._dirty = False
        if state is not None:
            self._load(state)

    # ------------------------------------------------------------------ robots
    def enrolled(self, robot: str) -> bytes | None:
        """The key ``robot`` is enrolled with (pins, fleet file, a trusted replica's roster), if any."""
        return self._pins.get(robot) or self._rosters.get(robot)

    def pinned(self, robot: str) -> bool:
        """Whether ``robot``'s key comes from its enrolment (not merely trusted on first use)."""
        return self.enrolled(robot) is not None

    def learn_roster(self, robots: Mapping[str, bytes]) -> None:
        """The robots a trusted replica enrolled (its signed audit answer); pins win over rosters."""
        self._rosters.update(robots)

    def admit(self, robot: str, key: bytes) -> str | None:
        """Whether a record of ``robot`` signed by ``key`` is worth a signature check, before any.

        Returns:
            None (the key is ``robot``'s), ``identity_changed`` (another key is), ``unknown_robot``
            (nobody enrolled it) or ``too_many_robots`` (no first-use place left).
        """
        trusted = self.enrolled(robot) or self._first_keys.get(robot)
        if trusted is None:
            if not self._first_use:
                return "unknown_robot"
            if len(self._first_keys) >= self._max_robots:
                return "too_many_robots"
            self._first_keys[robot] = trusted = key
            self._dirty = True
        return None if key == trusted else "identity_changed"

    def fresh(self, robot: str, run: int, seq: int) -> bool:
        """Whether a verified record is newer than every one seen of ``robot`` (then remembered)."""
        last = self._runs.get(robot)
        if last is not None and (run, seq) <= (last.run, last.seq):
            return False
        self._runs[robot] = _Run(run, seq)
        self._dirty = True
        return True

    # ------------------------------------------------------------------ replicas
    def server_trusted(self, prefix: str, identity: bytes) -> bool:
        """Whether the replica at ``prefix`` speaking as ``identity`` is believed."""
        if identity in self._servers:
            return True
        first = self._first_servers.get(prefix)
        if first is None:
            if not self._first_use or len(self._first_servers) >= self._max_robots:
                return False
            self._first_servers[prefix] = first = identity
            self._dirty = True
        return first == identity

    # ------------------------------------------------------------------ state file
    def save(self) -> None:
        """Write what was seen to the state file, if anything changed.

        Raises:
            TrustError: the file cannot be written.
        """
        if (state := self.changed_state()) is not None:
            self.write_state(state)

    def changed_state(self) -> bytes | None:
        """What `write_state` would write, if anything changed since the last call (then marked saved).

        Taken on the event loop, where the state changes; the write may then run on a thread.
        """
        if self._state is None or not self._dirty:
            return None
        self._dirty = False
        state = {
            "version": _STATE_VERSION,
            "runs": {robot: [last.run, last.seq] for robot, last in self._runs.items()},
            "first_use": {robot: fingerprint(key) for robot, key in self._first_keys.items()},
            "servers": {prefix: fingerprint(key) for prefix, key in self._first_servers.items()},
        }
        return json.dumps(state).encode()

    def write_state(self, state: bytes) -> None:
        """Write ``state`` (`changed_state`) to the state file (a blocking write: off the loop when serving).

        Raises:
            TrustError: the file cannot be written (the state is marked unsaved again).
        """
        assert self._state is not None
        try:
            write_private(self._state, state, what="monitor state")
        except PrivateFileError as exc:
            self._dirty = True
            raise TrustError(str(exc)) from None

    def _load(self, path: Path) -> None:
        try:
            state = json.loads(read_private(path, what="monitor state", secret=False))
        except FileNotFoundError:
            return
        except PrivateFileError as exc:
            raise TrustError(str(exc)) from None
        except ValueError as exc:
            raise TrustError(f"{path}: not a monitor state file ({exc}); move it away to start afresh") from None
        try:
            if state.get("version") != _STATE_VERSION:
                raise ValueError(f"version {state.get('version')!r}, expected {_STATE_VERSION}")
            self._runs = {robot: _Run(int(run), int(seq)) for robot, (run, seq) in state["runs"].items()}
            self._first_keys = {robot: parse_fingerprint(text) for robot, text in state["first_use"].items()}
            self._first_servers = {prefix: parse_fingerprint(text) for prefix, text in state["servers"].items()}
        except (AttributeError, ValueError, KeyError, TypeError, WireError) as exc:
            raise TrustError(f"{path}: not a monitor state file ({exc}); move it away to start afresh") from None
