"""How many robots one replica carries: docs/design/capacity.md with the forward time measured after warm-up.

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
line with the fixes, named as the policy's own options (`servo.wire.Tuning`: ``chunk_size``, a
Diffusion policy's ``n_action_steps``, ``num_inference_steps``…), since the robot otherwise
sits on its fallback with no word why.

``t`` is the median of the requests timed after the warm-up (``model.plan_forwards``, 10 by
default; `ForwardTiming`), not the fastest of a few: one lucky forward made the same checkpoint
"5 robots" once and "0 robots" another time. The plan shows the p90 and the machine's load
beside it, since a busy machine's forwards are not a quiet one's.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from servo.wire import Tuning

#: Utilisation the formula leaves the device: above it, queueing delays grow without bound.
UTILISATION = 0.8
#: Network round trip the plan assumes (a LAN); the server cannot measure its robots' links.
ASSUMED_RTT_S = 0.010


@dataclass(frozen=True)
class ForwardTiming:
    """Requests timed after the warm-up, and how busy the machine was meanwhile. Immutable.

    Args:
        median_s: Their median duration (s): the plan's forward time.
        p90_s: Their 90th percentile (s).
        count: How many were timed.
        load: The machine's 1-minute load average right after (None where the OS has none).
        cores: CPU cores of the machine.
    """

    median_s: float
    p90_s: float
    count: int
    load: float | None
    cores: int

    @classmethod
    def measure(cls, durations: Sequence[float]) -> ForwardTiming | None:
        """The timing of ``durations`` (s) with the load now; None without any."""
        if not durations:
            return None
        ordered = sorted(durations)
        p90 = ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]
        try:
            load: float | None = os.getloadavg()[0]
        except OSError:
            load = None
        return cls(statistics.median(ordered), p90, len(ordered), load, os.cpu_count() or 1)

    @property
    def busy(self) -> bool:
        """More runnable work than cores: forwards were slower than on a quiet machine."""
        return self.load is not None and self.load > self.cores

    def describe(self, device: str) -> str:
        """``forward 84.7 ms median, p90 95.2 ms (10 timed after warm-up on cpu; load 1.3 on 2 cores)``."""
        load = "" if self.load is None else f"; load {self.load:.1f} on {self.cores} cores"
        busy = ", a busy machine: time it again when quiet" if self.busy else ""
        return (
            f"forward {ms(self.median_s)} median, p90 {ms(self.p90_s)} "
            f"({self.count} timed after warm-up on {device}{load}{busy})"
        )


@dataclass(frozen=True)
class CapacityPlan:
    """One replica's capacity from its measured forward time. Immutable.

    Args:
        forward_s: Server time per request (s): the median of the requests timed after warm-up.
        chunk_size: Steps per chunk.
        fps: Control rate the robots run at (the policy's).
        rtc: Chunks replace the queue (real-time chunking) rather than being appended.
        buffer_s: The edge's ``buffer_time_s``: it asks when its queue holds less (s).
        rtt_s: Network round trip (s).
        tuning: The policy's own options that lengthen a chunk or shorten a forward.
    """

    forward_s: float
    chunk_size: int
    fps: float
    rtc: bool
    buffer_s: float
    rtt_s: float = ASSUMED_RTT_S
    tuning: Tuning = field(default_factory=Tuning)

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

    @property
    def needed_steps(self) -> int:
        """The shortest chunk that supplies one robot.

        It outlasts a forward and the network round trip, and one robot's requests keep the device
        at most `UTILISATION` busy.
        """
        by_latency = self.forward_s + 2 * self.rtt_s
        by_load = self.forward_s / UTILISATION + (self.buffer_s if self.rtc else 0.0)
        return math.floor(max(by_latency, by_load) * self.fps) + 1

    @property
    def edge_buffer_s(self) -> float | None:
        """The ``--buffer-time-s`` edges need for one robot to be supplied, when the default is too short.

        None when the default does, or when the buffer is not what falls short (a forward longer
        than a chunk, or one robot's requests alone keeping the device too busy). Seconds as the
        flag takes them, rounded up to 50 ms.
        """
        if self.robots > 0 or self.forward_s >= self.chunk_s:
            return None
        buffer = math.ceil((self.forward_s + 2 * self.rtt_s) * 20) / 20
        if buffer <= self.buffer_s or buffer >= self.chunk_s:
            return None
        fits = CapacityPlan(self.forward_s, self.chunk_size, self.fps, self.rtc, buffer, self.rtt_s, self.tuning)
        return buffer if fits.robots > 0 else None

    def describe(self, *, device: str, max_sessions: int, timing: ForwardTiming | None = None) -> list[str]:
        """The plan in three lines or fewer: timing, capacity, and a warning when one applies."""
        t, d, e, w, rtt = (ms(v) for v in (self.forward_s, self.chunk_s, self.executed_s, self.budget_s, self.rtt_s))
        how = f"RTC: the chunk less the edge's {ms(self.buffer_s)} buffer" if self.rtc else "chunks appended"
        measured = timing.describe(device) if timing is not None else f"forward {t} (measured on {device})"
        lines = [
            f"{measured}; chunk {self.chunk_size} steps = {d} at {self.fps:g} fps; a robot asks every {e} ({how}) "
            f"and needs its chunk within {w}"
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
                f"of actions and hold on their fallback; serve {self.tuning.longer_chunk(self.needed_steps)} or "
                f"{self.tuning.faster_forward()}"
            )
        if self.robots > 0:
            return None
        buffer = self.edge_buffer_s
        if buffer is not None:
            return (
                f"warning: a forward ({t}) outlasts the {ms(self.budget_s)} of actions an edge keeps queued: robots "
                f"pause between chunks; run edges with --buffer-time-s {buffer:g} (less than the {d} chunk), or "
                f"serve {self.tuning.faster_forward()}"
            )
        return (
            f"warning: a forward ({t}) takes more than {UTILISATION:.0%} of the {ms(self.executed_s)} between one "
            f"robot's requests: one robot keeps the replica busy and its chunks come late under any load; serve "
            f"{self.tuning.longer_chunk(self.needed_steps)} or {self.tuning.faster_forward()}"
        )


def ms(seconds: float) -> str:
    """A duration for a person: ``928 ms``, ``12.3 ms``, ``10 ms``, ``0.42 ms``."""
    value = seconds * 1e3
    return f"{value:.0f} ms" if value >= 100 else f"{value:.3g} ms"
