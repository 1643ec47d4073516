"""One robot's timeline, joined from its recordings and the replicas' audit logs (docs/design/audit.md §1).

The join is mechanical: every policy action a recording holds names the (session, seq) of its
chunk, and every audit line names the (session, seq) it answered. Times are the edge's: a
recording's header holds the edge's wall clock and monotonic clock read together, so "14:03"
selects frames, and a server's request is placed at the edge time of its own observation. Audit
timestamps (the server's wall clock) are used only for requests no frame names (superseded,
refused or abandoned ones), and are shown as such: two machines' clocks are never silently mixed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from servo.errors import ServoError
from servo.recording import EpisodeHeader, FrameRecord, iter_records
from servo.wire import WireError, decode_tensor

#: Tick sources without a fresh action.
HELD = ("fallback", "none")


class TraceError(ServoError, ValueError):
    """The inputs cannot be joined; the message names the file or the option."""


@dataclass
class Request:
    """One request of the robot: what the edge saw of it and what its replica audited.

    ``sent_ns`` is when its observation was taken (edge wall clock, ns); ``first_ns`` when the
    first action of its chunk was executed (None: never). ``audit`` is the replica's line.
    """

    session_id: str
    seq_id: int
    sent_ns: int | None = None
    first_ns: int | None = None
    actions: int = 0
    audit: dict[str, Any] | None = None
    #: True when placed by the server's clock (no frame names it).
    server_clock: bool = False

    @property
    def at_ns(self) -> int:
        """Where the request sits on the timeline."""
        if self.sent_ns is not None:
            return self.sent_ns
        assert self.audit is not None
        return int(self.audit["_wall_ns"])


@dataclass
class Timeline:
    """Everything known about one robot between ``start_ns`` and ``end_ns`` (edge wall clock)."""

    robot: str
    start_ns: int
    end_ns: int
    fps: float = 0.0
    joint_names: list[str] = field(default_factory=list)
    #: (edge wall ns, state, reason)
    transitions: list[tuple[int, str, str]] = field(default_factory=list)
    #: (edge wall ns, source, action or None) per tick
    ticks: list[tuple[int, str, np.ndarray | None]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    #: What each recording of the robot covers: (first tick ns, last tick ns, file), in time order.
    covers: list[tuple[int, int, str]] = field(default_factory=list)
    #: The tick just before the window and the one just after went without a fresh action too:
    #: a stretch that touches that edge of the window goes on past it.
    held_before: bool = False
    held_after: bool = False

    def fallback_runs(self) -> list[tuple[int, int, int]]:
        """Stretches of consecutive ticks without a fresh action: ``(first ns, last ns, ticks)``."""
        runs: list[tuple[int, int, int]] = []
        start = last = None
        count = 0
        for at, source, _ in self.ticks:
            if source in HELD:
                start = at if start is None else start
                last, count = at, count + 1
            elif start is not None and last is not None:
                runs.append((start, last, count))
                start, count = None, 0
        if start is not None and last is not None:
            runs.append((start, last, count))
        return runs


def parse_time(text: str, day_of: int) -> int:
    """``HH:MM[:SS]`` on the local day of ``day_of`` (ns since the epoch), or an ISO 8601 instant.

    Raises:
        TraceError: neither form.
    """
    try:
        if "T" in text or "-" in text:
            instant = datetime.fromisoformat(text)
            if instant.tzinfo is None:
                instant = instant.astimezone()
            return int(instant.timestamp() * 1e9)
        parts = [int(p) for p in text.split(":")]
        if len(parts) not in (2, 3):
            raise ValueError(text)
        day = datetime.fromtimestamp(day_of / 1e9).astimezone()
        at = day.replace(hour=parts[0], minute=parts[1], second=parts[2] if len(parts) == 3 else 0, microsecond=0)
        return int(at.timestamp() * 1e9)
    except ValueError:
        raise TraceError(f"--at {text!r}: expected HH:MM, HH:MM:SS or an ISO 8601 time") from None


def read_audit(paths: Iterable[str | Path], robot: str) -> dict[tuple[str, int], dict[str, Any]]:
    """The robot's audit lines by (session id, seq id), each with ``_wall_ns``: its arrival (server clock).

    Raises:
        TraceError: a file that cannot be read, or a line that is not a JSON object.
    """
    lines: dict[tuple[str, int], dict[str, Any]] = {}
    for path in paths:
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise TraceError(f"--audit {path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
        for number, raw in enumerate(text.splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
                if not isinstance(line, dict):
                    raise ValueError("not an object")
            except ValueError:
                raise TraceError(f"--audit {path} line {number}: not a JSON object") from None
            if line.get("client_id") != robot or "seq_id" not in line:
                continue
            stamp = line.get("timestamp")
            # Written as the answer left: its observation arrived `staleness_ms` earlier.
            left = int(datetime.fromisoformat(stamp).timestamp() * 1e9) if stamp else 0
            line["_wall_ns"] = left - int(float(line.get("staleness_ms", 0.0)) * 1e6) if left else 0
            line.setdefault("replica", Path(path).name.split(".")[0])
            lines[(str(line.get("session_id")), int(line["seq_id"]))] = line
    return lines


def build(
    robot: str,
    recordings: Iterable[str | Path],
    audit: dict[tuple[str, int], dict[str, Any]],
    *,
    start_ns: int | None = None,
    end_ns: int | None = None,
    episode: int | None = None,
) -> Timeline:
    """Join the robot's recordings with its audit lines over a time window or one episode.

    Raises:
        TraceError: no recording of ``robot`` covers the window or holds the episode.
    """
    timeline = Timeline(robot, start_ns or 0, end_ns or 0)
    requests: dict[tuple[str, int], Request] = {}
    covered = False
    # The ticks nearest outside the window, each (ns, held), to tell a stretch cut by its edges.
    before: tuple[int, bool] | None = None
    after: tuple[int, bool] | None = None
    for path in recordings:
        header, frames = _read(path)
        if header.client_id and header.client_id != robot:
            continue
        if not header.start_wall_ns:
            raise TraceError(f"--recording {path}: no clock pair in its header (recorded by an older servo-edge)")
        timeline.fps, timeline.joint_names = header.fps, list(header.joint_names)
        if frames:
            first, last = (header.wall_ns(frame.mono_ns) for frame in (frames[0], frames[-1]))
            assert first is not None
            assert last is not None
            timeline.covers.append((first, last, Path(path).name))
        # A tick without a policy action belongs to the episode of the last one that had one.
        current = header.episode_id
        for frame in frames:
            at = header.wall_ns(frame.mono_ns)
            assert at is not None
            if frame.provenance is not None:
                current = frame.provenance[2]
            for mono, state, reason in frame.transitions:
                wall = header.wall_ns(mono)
                assert wall is not None
                if _inside(wall, timeline, episode, current):
                    timeline.transitions.append((wall, state, reason))
            if not _inside(at, timeline, episode, current):
                held = frame.source in HELD
                if episode is None and at < timeline.start_ns and (before is None or at > before[0]):
                    before = (at, held)
                elif episode is None and at >= timeline.end_ns and (after is None or at < after[0]):
                    after = (at, held)
                continue
            covered = True
            action = None if frame.action is None else decode_tensor(frame.action, dtype="float32")
            timeline.ticks.append((at, frame.source, action))
            if frame.provenance is not None:
                session, seq, _, obs_mono = frame.provenance
                request = requests.setdefault((session, seq), Request(session, seq))
                request.sent_ns = header.wall_ns(obs_mono)
                request.first_ns = at if request.first_ns is None else request.first_ns
                request.actions += 1
    if not covered:
        where = (
            f"episode {episode}"
            if episode is not None
            else f"{_clock(timeline.start_ns)} to {_clock(timeline.end_ns)} (--at, --window)"
        )
        raise TraceError(f"no recording of {robot!r} covers {where}; {coverage(timeline.covers, robot)}")
    if episode is not None:
        timeline.start_ns, timeline.end_ns = timeline.ticks[0][0], timeline.ticks[-1][0]
    timeline.covers.sort()
    timeline.held_before = before is not None and before[1]
    timeline.held_after = after is not None and after[1]
    sessions = {session for session, _ in requests}
    for key, line in audit.items():
        joined = requests.get(key)
        if joined is not None:
            joined.audit = line
        elif key[0] in sessions and timeline.start_ns <= line["_wall_ns"] <= timeline.end_ns:
            requests[key] = Request(key[0], key[1], audit=line, server_clock=True)
    timeline.requests = sorted(requests.values(), key=lambda r: (r.at_ns, r.seq_id))
    timeline.transitions.sort()
    timeline.ticks.sort(key=lambda tick: tick[0])
    return timeline


def coverage(covers: list[tuple[int, int, str]], robot: str) -> str:
    """What the recordings cover, for a person: ``its recordings cover 15:17:53.508 to 15:17:56.742 (ep1.servo)``."""
    if not covers:
        return f"no recording given is {robot!r}'s"
    spans = ", ".join(f"{_clock(first)} to {_clock(last)} ({name})" for first, last, name in sorted(covers))
    return f"its recordings cover {spans}"


def _clock(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _read(path: str | Path) -> tuple[EpisodeHeader, list[FrameRecord]]:
    try:
        records = list(iter_records(path))
    except (OSError, WireError) as exc:
        raise TraceError(f"--recording {path}: {exc}") from None
    if not records or not isinstance(records[0], EpisodeHeader):
        raise TraceError(f"--recording {path}: no header")
    return records[0], [r for r in records[1:] if isinstance(r, FrameRecord)]


def _inside(at: int, timeline: Timeline, episode: int | None, current: int) -> bool:
    if episode is not None:
        return current == episode
    return timeline.start_ns <= at < timeline.end_ns
