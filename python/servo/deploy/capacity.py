"""How many robots one replica carries: docs/design/capacity.md with the forward time measured at warm-up.

With ``t`` the server time per request, ``r`` the rate at which one robot asks, ``W`` how long a
robot can wait for its chunk before its queue runs dry and ``RTT`` the network round trip, the formula
bounds the robots one replica serves by the device's utilisation (at most 80 %) and by the
latency every robot must see when all ask at once (each waits behind the others)::

    N_max = min(0.8 / (r * t), (W - 2 * RTT) / t)

What ``r`` and ``W`` are follows from how the edge asks (`servo.edge.pipeline`): it sends the
next observation when its queue holds less than ``buffer_time_s`` (B) of actions. A chunk of
``chunk_size`` steps lasts D = chunk_size / fps. With real-time chunking each chunk replaces the
queue, so a robot executes D - B of every chunk (the executed horizon) and then asks again;
appended chunks are executed whole, so it asks every D. Either way the chunk must be back
before the B it still holds runs out, and never later than a chunk lasts: W = min(B, D). A
robot never asks faster than one round trip, t + RTT.

A forward longer than a chunk can never keep even one robot supplied: the plan says so in one
line with the fixes, since the robot otherwise sits on its fallback with no word why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Utilisation the formula leaves the device: above it, queueing delays grow without bound.
UTILISATION = 0.8
#: Network round trip the plan assumes (a LAN); the server cannot measure its robots' links.
ASSUMED_RTT_S = 0.010
#: What makes forwards shorter or chunks longer, named in every warning.
FIXES = "a GPU (--device cuda), fewer or lower-resolution cameras, a smaller model, or a longer chunk (chunk_size)"


@dataclass(frozen=True)
class CapacityPlan:
    """One replica's capacity from its measured forward time. Immutable.

    Args:
        forward_s: Server time per request (s), measured at warm-up.
        chunk_size: Steps per chunk.
        fps: Control rate the robots run at (the policy's).
        rtc: Chunks replace the queue (real-time chunking) rather than being appended.
        buffer_s: The edge's ``buffer_time_s``: it asks when its queue holds less (s).
        rtt_s: Network round trip (s).
    """

    forward_s: float
    chunk_size: int
    fps: float
    rtc: bool
    buffer_s: float
    rtt_s: float = ASSUMED_RTT_S

    @property
    def chunk_s(self) -> float:
        """How long one chunk lasts at ``fps`` (s)."""
        return self.chunk_size / self.fps

    @property
    def executed_s(self) -> float:
        """The executed horizon: what a robot runs of each chunk before it asks again (s)."""
        horizon = self.chunk_s - self.buffer_s if self.rtc else self.chunk_s
        return max(horizon, self.forward_s + self.rtt_s)

    @property
    def budget_s(self) -> float:
        """How long a robot can wait for its chunk before its queue runs dry (s)."""
        return min(self.buffer_s, self.chunk_s)

    @property
    def robots(self) -> int:
        """The formula's N_max: robots one replica keeps supplied (0 when not even one)."""
        if self.forward_s >= self.chunk_s:
            return 0
        by_load = UTILISATION * self.executed_s / self.forward_s
        by_latency = (self.budget_s - 2 * self.rtt_s) / self.forward_s
        return max(0, math.floor(min(by_load, by_latency)))

    def describe(self, *, device: str, max_sessions: int) -> list[str]:
        """The plan in three lines or fewer: timing, capacity, and a warning when one applies."""
        t, d, e, w, rtt = (ms(v) for v in (self.forward_s, self.chunk_s, self.executed_s, self.budget_s, self.rtt_s))
        how = f"RTC: the chunk less the edge's {ms(self.buffer_s)} buffer" if self.rtc else "chunks appended"
        lines = [
            f"forward {t} (measured at warm-up on {device}); chunk {self.chunk_size} steps = {d} at "
            f"{self.fps:g} fps; a robot asks every {e} ({how}) and needs its chunk within {w}"
        ]
        formula = f"min({UTILISATION:g} * {e} / {t}, ({w} - 2 * {rtt}) / {t})"
        capacity = (
            f"capacity: one replica carries {self.robots} robot(s) at {self.fps:g} fps = {formula} "
            f"(docs/design/capacity.md, {rtt} network round trip assumed)"
        )
        if 0 < self.robots < max_sessions:
            capacity += (
                f"; serving.max_sessions = {max_sessions} admits more: set it to {self.robots} "
                f"(--max-sessions {self.robots})"
            )
        lines.append(capacity)
        warning = self.warning()
        if warning is not None:
            lines.append(warning)
        return lines

    def warning(self) -> str | None:
        """One line when not even one robot can be kept supplied, with the fixes; else None."""
        t, d = ms(self.forward_s), ms(self.chunk_s)
        if self.forward_s >= self.chunk_s:
            return (
                f"warning: a forward ({t}) takes longer than a chunk lasts ({d} at {self.fps:g} fps): robots run out "
                f"of actions and hold on their fallback; use {FIXES}"
            )
        if self.robots == 0:
            # Seconds, as the flag takes them, rounded up to 50 ms.
            buffer = math.ceil((self.forward_s + 2 * self.rtt_s) * 20) / 20
            return (
                f"warning: a forward ({t}) outlasts the {ms(self.budget_s)} of actions an edge keeps queued: robots "
                f"pause between chunks; run edges with --buffer-time-s {buffer:g} (less than the {d} chunk), or use "
                f"{FIXES}"
            )
        return None


def ms(seconds: float) -> str:
    """A duration for a person: ``928 ms``, ``12.3 ms``, ``10 ms``, ``0.42 ms``."""
    value = seconds * 1e3
    return f"{value:.0f} ms" if value >= 100 else f"{value:.3g} ms"


def measured_forward_s(durations: list[float]) -> float | None:
    """The forward time a plan uses: the fastest warm-up forward after the first (None without any).

    The first forward pays for lazy initialisation (cuDNN autotuning, compilation, allocator
    growth), so it stands in only when it is the only one.
    """
    steady = durations[1:] or durations
    return min(steady) if steady else None
