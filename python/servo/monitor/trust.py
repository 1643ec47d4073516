"""Which Ed25519 key may sign a robot's telemetry, and which records are replays.

A monitor trusts a robot's key when it is pinned (a ``--robot-keys`` file of ``<robot>
ed25519:<fingerprint>`` lines, e.g. from the fleet's enrolment) or, for a robot nobody pinned,
when it is the first key the monitor saw for that robot (trust on first use, like ssh). A record
signed by any other key is refused and the robot is flagged ``identity changed``: whoever signs
it is not the robot the monitor knows.

Records count up (``seq``) within a run (``boot``, random per run). A record is fresh when it is
the first of its robot, or later than the last one of the same run, or of a new run not seen
before; a run once superseded never comes back, so a replayed record is refused whatever its
``seq``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from servo.errors import SecurityError
from servo.wire import WireError, parse_fingerprint, segment

#: Past runs remembered per robot (their records are refused).
RETIRED_BOOTS = 16


class TrustError(SecurityError, ValueError):
    """The pins file cannot be used; the message names the file and the line."""


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
class _Runs:
    """One robot's current run and the runs it left behind."""

    boot: bytes
    seq: int
    retired: deque[bytes] = field(default_factory=lambda: deque(maxlen=RETIRED_BOOTS))


class RobotTrust:
    """Keys and replay state of every robot a monitor heard from. Owned by the monitor's event loop.

    Args:
        pins: Keys that alone may sign for their robot.
        max_robots: Most robots remembered; records of further robots are refused (a flat network
            lets anybody invent robot ids with keys of their own).
    """

    def __init__(self, pins: dict[str, bytes] | None = None, *, max_robots: int = 4096) -> None:
        self._pins = dict(pins or {})
        self._first_use: dict[str, bytes] = {}
        self._runs: dict[str, _Runs] = {}
        self._max_robots = max_robots

    def pinned(self, robot: str) -> bool:
        """Whether ``robot``'s key was pinned (not merely trusted on first use)."""
        return robot in self._pins

    def check(self, robot: str, key: bytes, boot: bytes, seq: int) -> str | None:
        """Accept one verified record (its signature already checked) or say why not.

        Returns:
            None when accepted (the key is trusted, the record fresh); else ``identity_changed``,
            ``replay`` or ``too_many_robots``.
        """
        trusted = self._pins.get(robot) or self._first_use.get(robot)
        if trusted is None:
            if len(self._first_use) + len(self._pins) >= self._max_robots:
                return "too_many_robots"
            self._first_use[robot] = trusted = key
        if key != trusted:
            return "identity_changed"
        runs = self._runs.get(robot)
        if runs is None:
            self._runs[robot] = _Runs(boot, seq)
            return None
        if boot == runs.boot:
            if seq <= runs.seq:
                return "replay"
            runs.seq = seq
            return None
        if boot in runs.retired:
            return "replay"
        runs.retired.append(runs.boot)
        runs.boot, runs.seq = boot, seq
        return None
