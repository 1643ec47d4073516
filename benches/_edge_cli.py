"""``servo-edge`` as a user runs it, in a child process, and what its recording says the arm did.

`run_edge` drives the simulated arm for a while with ``--record`` and ``--summary``, as
`CLIENT_ID` (`enrolment` is the ``[security] robots`` line a server off loopback needs for it);
`fresh_actions` and `reconnect_reasons` read the recording: ticks on policy actions after the
first one, the longest time without one, and why the edge reconnected (its fail-safe
transitions to RECONNECTING, with their reasons).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servo.recording import Recording, read_recording

#: The robot's name: a server that enrols robots admits it under this name (`enrolment`).
CLIENT_ID = "bench-arm"


def enrolment(env: Mapping[str, str] | None = None) -> str:
    """``robots = [...]`` enrolling this machine's robot identity (servo's directory) as `CLIENT_ID`."""
    command = [sys.executable, "-m", "servo.cli.edge", "--identity"]
    printed = subprocess.run(
        command, capture_output=True, text=True, timeout=60, check=True, env={**os.environ, **(env or {})}
    )
    fingerprint = printed.stdout.split()[0]
    return f'robots = [{{name = "{CLIENT_ID}", identity = "{fingerprint}"}}]'


@dataclass(frozen=True)
class EdgeRun:
    """One ``servo-edge`` run: its summary (JSON) and recording."""

    summary: dict[str, Any]
    recording: Recording

    def row(self) -> dict[str, Any]:
        """What the arm did, for a results table."""
        summary = self.summary
        return {
            **fresh_actions(self.recording),
            "reconnects": summary["reconnects"],
            "reasons": dict(reconnect_reasons(self.recording)),
            "requests": summary["requests"],
            "resent": summary["resent"],
            "timeouts": summary["timeouts"],
            "rtt_ms_p50": summary["rtt_ms"].get("p50"),
            "final_state": summary["final_state"],
        }


def run_edge(
    workdir: Path,
    connect: str,
    seconds: float,
    *,
    options: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> EdgeRun:
    """``servo-edge --robot sim --connect CONNECT`` for ``seconds``, recording every tick (its output: ``edge.log``).

    Raises:
        AssertionError: it wrote no summary (its stderr's tail in the message).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    summary, record = workdir / "summary.json", workdir / "edge.rec"
    command = [sys.executable, "-m", "servo.cli.edge", "--robot", "sim", "--client-id", CLIENT_ID]
    command += ["--no-status", "--connect", connect]
    command += ["--duration", str(seconds), "--summary", str(summary), "--record", str(record)]
    command += ["--log-level", "warning", *options]
    log = workdir / "edge.log"
    with log.open("w") as out:
        edge = subprocess.run(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=seconds + 120,
            check=False,
            env={**os.environ, **(env or {})},
        )
    if not summary.exists():
        raise AssertionError(f"servo-edge wrote no summary (exit {edge.returncode}):\n{log.read_text()[-3000:]}")
    return EdgeRun(json.loads(summary.read_text()), read_recording(record))


def fresh_actions(recording: Recording) -> dict[str, Any]:
    """Ticks after the first policy action, the share on policy actions, the longest time without one (s)."""
    frames = recording.frames
    first = next((i for i, f in enumerate(frames) if f.source == "policy"), None)
    if first is None:
        return {"ticks": 0, "fresh_share": 0.0, "longest_gap_s": float("inf")}
    window = frames[first:]
    tick_ns = 1e9 / recording.header.fps
    longest, previous = 0, window[0].mono_ns
    for frame in window:
        if frame.source == "policy":
            longest = max(longest, frame.mono_ns - previous)
            previous = frame.mono_ns
    longest = max(longest, window[-1].mono_ns - previous + round(tick_ns))
    fresh = sum(f.source == "policy" for f in window)
    return {
        "ticks": len(window),
        "fresh_share": fresh / len(window),
        "longest_gap_s": max(0.0, (longest - tick_ns) / 1e9),
    }


def reconnect_reasons(recording: Recording) -> Counter[str]:
    """Why the edge reconnected: the reasons of its transitions to RECONNECTING."""
    return Counter(reason for f in recording.frames for _, state, reason in f.transitions if state == "reconnecting")
