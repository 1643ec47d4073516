"""Link-aware codec choice: raw pixels or JPEG (and which quality), per request.

What a request costs the robot, besides the server's compute, is ``encode + transfer + server
decode + fixed overheads``; JPEG trades codec time for bytes. On shared memory or a fast LAN raw
wins (no codec at all), on a 100 Mbit/s link JPEG wins by 5x. `CodecChooser` measures that cost
for every option it tries — from the moment the observation is handed to the session until its
chunk arrives, minus the server-reported queue wait and inference — keeps the median of the last
few samples per option, and picks:

* the best-fidelity option (raw, then the qualities high to low) whose cost is within
  ``tolerance`` of the cheapest: a lower quality must buy a real saving;
* hysteresis: the option in use is left for a cheaper one only when it costs ``hysteresis`` more
  (plus ``hysteresis_ms``), and never twice within ``min_dwell`` requests; a switch soon after
  the previous one doubles that dwell (up to 16x), so options of nearly equal cost cannot flap;
* start-up: the first request carries the option in use, raw, alone (the arm waits for its first
  chunk anyway), then the others are measured; an option in use is confirmed (``CONFIRM``
  samples) before it is left, unless its one sample already costs ``FAR`` times the best and
  ``FAR_MS`` more (raw on a slow or lossy link, where each raw request starves the arm for
  seconds): it is then left at once and postponed like a hopeless probe (below);
* re-probing: every option not in use is tried for one request after ``reprobe_every`` requests,
  the interval doubling (or growing by the factor it lost by, up to 16x) each time it loses
  again, so a link that speeds up or slows down is noticed without paying for the losing option
  often (a probe costs about 1/``reprobe_every`` of the mean cost);
* postponing hopeless probes: a probe is one request at the probed option's cost, so on a slow
  link one raw probe (~150 ms at 100 Mbit/s, 13x JPEG's cost) sets the rtt tail even when it is
  rare — the mean hardly notices, p99 does. A due probe is therefore put off while the option's
  last two measurements cost at least ``FAR`` times what the option in use costs now (one
  measurement could be noise) and nothing since says that could have changed. Two things can close
  the gap: the option in use got dearer (codec slower: compared with its cost now), or the link
  got faster (a rise of the option in use's effective throughput by ``RISE`` since the postponed
  one was measured; if it fell instead, the link got slower for every option and the old cost is
  scaled up by that fall). Such an option waits for that evidence, not for its interval, so a
  faster link brings it back within a few requests. The small option's throughput understates a
  speed-up of the link (its time also holds fixed overheads) — hence a rise of ``RISE``, not a
  prediction of the new cost — and if it misses one (fixed latency dominating), the probe still
  happens after ``MAX_POSTPONE`` x ``reprobe_every`` requests. ``FAR`` is above the size ratio of
  the default qualities (95 to 80: ~3.4x, and their cost ratio is smaller), so they keep being
  compared.

A link too slow for all of ``qualities`` (a congestion window collapsed by loss and delay: ~10
kB/s at 20 % loss and a 0.35 s round trip) times requests out, each recorded at what it cost to
get nothing. Once raw, the lowest of ``qualities`` (probed first then) and all between cost
``starved_ms`` or more, the ``floor`` qualities (never used otherwise) take over at once: the
lowest, or a higher one measured under ``starved_ms``; once one of ``qualities`` is (re-probes),
the best of them takes over at once. A floor quality never wins on cost alone.

On a local link (the server on this machine: shared memory or loopback) raw always costs least:
no codec on either side, and the bytes only cross memory. Measured choices would still pick JPEG
there whenever a busy scheduler stretches raw's samples (12 of 16 requests at load 10), and lose
the exact pixels for nothing, so ``auto`` sends raw on a local link without probing JPEG, unless
raw is measured slow there: its effective throughput below `LOCAL_SLOW_MBPS` on frames of at least
`LOCAL_MEASURE_BYTES` (where bytes, not fixed overheads, set the time). Then it chooses as on any
other link.

The effective link throughput shown in status lines is an option's bytes over its cost without the
codec (``bytes / (rtt - compute - encode)``): a lower bound, since that time also holds the fixed
per-request overheads, so the largest such figure (usually the largest option's) among the options
measured in the last ``reprobe_every`` x ``MAX_BACKOFF`` requests is shown — a postponed option's
samples may be older and describe the link as it was.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Annotated, Literal

import msgspec

from servo.config import Fraction, NonNegativeFloat, PositiveInt, Quality, doc

#: ``jpeg_quality`` of raw pixels (no codec).
RAW = 0
#: The re-probe interval of a losing option grows up to this multiple of ``reprobe_every``.
MAX_BACKOFF = 16
#: Samples an option not in use needs before it can be switched to (one could be noise).
CONFIRM = 3
#: A due probe is put off while the option's last two measurements cost this multiple of the option in use.
FAR = 4.0
#: ...unless the option in use's effective throughput rose by this factor since they were taken.
RISE = 1.5
#: ...and at most for this multiple of ``reprobe_every`` requests since the option was last measured.
MAX_POSTPONE = 128
#: An option in use measured once is left unconfirmed only when it costs FAR times the best and
#: this much more (ms): a session's cold first request (a thread starting, the first shared-memory
#: allocation) costs tens of ms more, a slow link's raw frames seconds.
FAR_MS = 250.0

#: A local link is slow (and auto chooses from measured costs) when raw frames cross it slower than this:
#: far below any memory copy, so that a busy scheduler (which stretches every option alike) never counts.
LOCAL_SLOW_MBPS = 25.0
#: ...measured on requests of at least this many frame bytes.
LOCAL_MEASURE_BYTES = 256_000

JpegQuality = Annotated[int, msgspec.Meta(ge=0, le=100)] | Literal["auto"]


class AutoCodec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How ``jpeg_quality = "auto"`` chooses (see the module docstring)."""

    qualities: Annotated[
        list[Quality], doc("JPEG qualities auto may use besides raw pixels.", min_length=1, max_length=8)
    ] = msgspec.field(default_factory=lambda: [95, 90, 80])
    tolerance: Annotated[Fraction, doc("A better-fidelity option wins while it costs at most this fraction more.")] = (
        0.05
    )
    hysteresis: Annotated[
        NonNegativeFloat, doc("The option in use is dropped only for one this fraction cheaper.", le=10)
    ] = 0.15
    hysteresis_ms: Annotated[NonNegativeFloat, doc("...and at least this much cheaper (ms).")] = 0.3
    min_dwell: Annotated[PositiveInt, doc("Requests at least between two switches.")] = 8
    reprobe_every: Annotated[PositiveInt, doc("Requests before an option not in use is tried again.")] = 32
    window: Annotated[PositiveInt, doc("Samples per option whose median is its cost.", le=100)] = 5
    floor: Annotated[
        list[Quality], doc("Lower JPEG qualities used only while all the others cost starved_ms or more.", max_length=4)
    ] = msgspec.field(default_factory=lambda: [40, 10])
    starved_ms: Annotated[NonNegativeFloat, doc("A request costing this much starves the arm (ms).")] = 1000.0


def codec_name(quality: int) -> str:
    """``raw`` or ``jpeg<quality>``."""
    return "raw" if quality == RAW else f"jpeg{quality}"


@dataclass(frozen=True)
class CodecStatus:
    """A snapshot of the chooser: what it uses, and what it measured (ms, bytes, Mbit/s)."""

    auto: bool
    current: str
    link_mbps: float | None
    cost_ms: dict[str, float]
    bytes: dict[str, int]
    requests: dict[str, int]
    switches: int
    probes: int
    #: Latest JPEG encode time of each camera at each quality (``front/jpeg90``), on its thread.
    camera_encode_ms: dict[str, float] = field(default_factory=dict)
    #: The server is on this machine (shared memory or loopback): auto keeps raw unless that is slow.
    local: bool = False


class _Option:
    """What one codec option was measured to cost (owned by its `CodecChooser`)."""

    def __init__(self, quality: int, window: int, interval: int) -> None:
        self.quality = quality
        self.cost_ms: deque[float] = deque(maxlen=window)
        self.net_ms: deque[float] = deque(maxlen=window)
        self.nbytes: deque[int] = deque(maxlen=window)
        #: The last two costs, kept when the window is forgotten: is the option hopeless?
        self.latest: deque[float] = deque(maxlen=2)
        #: Every option's effective throughput when this one was last measured.
        self.mbps_then: dict[int, float] = {}
        self.requests = 0
        self.interval = interval
        self.due = 0
        self.sampled_at = 0
        #: Left while in use after one sample, for costing FAR times the best: that sample is enough.
        self.left_far = False

    @property
    def cost(self) -> float | None:
        return statistics.median(self.cost_ms) if self.cost_ms else None

    @property
    def mbps(self) -> float | None:
        """Effective throughput (Mbit/s): its bytes over its time without the codec."""
        if not self.net_ms:
            return None
        return statistics.median(self.nbytes) * 8 / (max(statistics.median(self.net_ms), 1e-3) * 1e3)

    def forget(self) -> None:
        self.cost_ms.clear()
        self.net_ms.clear()
        self.nbytes.clear()


class CodecChooser:
    """Picks each request's codec from measured costs; owned by the event loop of its session.

    Args:
        quality: ``"auto"``, or a fixed quality (0 raw, 1..100 JPEG) it then always returns.
        settings: How auto chooses.
        local: The server is on this machine: auto keeps raw unless it is measured slow.
    """

    def __init__(
        self, quality: int | Literal["auto"], settings: AutoCodec | None = None, *, local: bool = False
    ) -> None:
        self.settings = settings = settings or AutoCodec()
        self.auto = quality == "auto"
        self.local = local
        qualities = [RAW, *sorted(set(settings.qualities), reverse=True)] if quality == "auto" else [int(quality)]
        #: Used only while the others starve the arm (module docstring).
        self._floor = [q for q in sorted(set(settings.floor), reverse=True) if q < qualities[-1]] if self.auto else []
        qualities += self._floor  # best fidelity first
        self._options = {q: _Option(q, settings.window, settings.reprobe_every) for q in qualities}
        self._rank = {q: i for i, q in enumerate(qualities)}
        self.current = qualities[0]
        self._request = 0
        self._last_switch = 0
        self._dwell = settings.min_dwell
        self.switches = 0
        self.probes = 0
        self._cold = True

    def next(self) -> int:
        """The quality of the next request: the current option, or one being (re-)probed."""
        self._request += 1
        chosen = self.current
        # The first request carries the option in use (raw, the largest) alone: it is measured
        # while the robot waits for its first chunk anyway, not as a probe once it streams.
        if self.auto and self._request > 1 and not self._raw_is_local():
            # Options not in use start due: each is measured before the first decision.
            due = [
                o
                for o in self._options.values()
                if o.quality != self.current and o.due <= self._request and not self._hopeless(o)
            ]
            due = [o for o in due if o.quality not in self._floor or self._starved()]
            if due:
                slow = self._known(floor=self.current in self._floor).get(self.current, 0) >= self.settings.starved_ms
                probe = due[-1] if slow else min(due, key=lambda o: o.due)
                if probe.sampled_at < self._request - self.settings.reprobe_every:
                    probe.forget()  # its samples describe the link as it was long ago
                probe.due = self._request + probe.interval  # `record` reschedules it
                self.probes += 1
                chosen = probe.quality
        self._options[chosen].requests += 1
        return chosen

    def record(self, quality: int, *, encode_ms: float, net_ms: float, nbytes: int) -> None:
        """One request's measured cost; may switch the option in use.

        Args:
            quality: The option the request used (what `next` returned).
            encode_ms: Time to encode its frames on this side.
            net_ms: Everything else but the server's compute: transfer both ways, server decode
                and fixed overheads (for a request that failed: how long it took to fail).
            nbytes: Bytes of its encoded frames.
        """
        option = self._options.get(quality)
        if option is None:
            return
        cold, self._cold = self._cold, False
        option.nbytes.append(nbytes)
        if not cold:
            # The first request of all is a cold start (threads starting, first allocations, tens
            # of ms): kept as evidence of a hopeless option only (`_decide`), not in the costs.
            option.cost_ms.append(encode_ms + net_ms)
            option.net_ms.append(net_ms)
        option.latest.append(encode_ms + net_ms)
        option.mbps_then = {q: m for q, o in self._options.items() if (m := o.mbps) is not None}
        option.sampled_at = self._request
        if not self.auto or cold or self._raw_is_local():
            return
        if self._floor and (self._starved() or self.current in self._floor):
            self._decide_floor()  # before confirming: each sample of a starving option is a timeout
            return
        if quality != self.current and not self._confirmed(option) and self._promising(option):
            option.due = self._request + 1  # one sample could be noise: confirm before it counts
            return
        self._decide()
        if quality != self.current:
            # It lost again: try it less often (a switch resets every interval), and the more
            # it lost by the rarer: a probe then adds about 1/reprobe_every to the mean cost.
            current = self._options[self.current].cost or encode_ms + net_ms
            ratio = (encode_ms + net_ms) / max(current, 1e-3)
            interval = max(option.interval * 2, round(self.settings.reprobe_every * ratio))
            option.interval = min(interval, self.settings.reprobe_every * MAX_BACKOFF)
            # A hopeless one waits for evidence (or the hard bound) instead: due now, postponed.
            option.due = self._request + (0 if self._hopeless(option) else option.interval)

    def _raw_is_local(self) -> bool:
        """Raw on a local link that is not measured slow: nothing to choose (see the module docstring)."""
        if not self.local or self.current != RAW:
            return False
        raw = self._options[RAW]
        if not raw.nbytes or statistics.median(raw.nbytes) < LOCAL_MEASURE_BYTES:
            return True
        mbps = raw.mbps
        return mbps is None or mbps >= LOCAL_SLOW_MBPS

    def _hopeless(self, option: _Option) -> bool:
        """Whether a due probe of `option` is put off (see the module docstring)."""
        current = self._options[self.current]
        cost, now, then = current.cost, current.mbps, option.mbps_then.get(self.current)
        if cost is None or now is None or then is None or len(option.latest) < (1 if option.left_far else 2):
            return False
        if self._request - option.sampled_at >= self.settings.reprobe_every * MAX_POSTPONE:
            return False
        return now < RISE * then and min(option.latest) * max(1.0, then / now) >= FAR * cost

    def _confirmed(self, option: _Option) -> bool:
        return len(option.cost_ms) >= min(CONFIRM, self.settings.window)

    def _promising(self, option: _Option) -> bool:
        current = self._options[self.current].cost
        return current is None or option.cost_ms[-1] <= current * (1 + self.settings.tolerance)

    def _known(self, *, floor: bool) -> dict[int, float]:
        """Measured costs (the median, else the latest samples) of the floor qualities, or of the others."""
        costs = {q: o.cost if o.cost is not None else min(o.latest, default=None) for q, o in self._options.items()}
        return {q: c for q, c in costs.items() if c is not None and (q in self._floor) == floor}

    def _starved(self) -> bool:
        """Raw and the lowest usual quality were measured, and all but the floor cost ``starved_ms`` or more."""
        known, lowest = self._known(floor=False), [q for q in self._options if q not in self._floor][-1]
        return RAW in known and lowest in known and min(known.values()) >= self.settings.starved_ms

    def _decide(self) -> None:
        left = self._options[self.current]
        # Known from its cold first request alone, the option in use is judged by that sample.
        current = left.cost if left.cost is not None else min(left.latest, default=None)
        since = self._request - self._last_switch
        if current is None or since < self._dwell:
            return
        costs: dict[int, float] = {}  # best fidelity first
        for q, o in self._options.items():
            if q == self.current:
                costs[q] = current
            elif self._confirmed(o) and (cost := o.cost) is not None:
                costs[q] = cost
        best = min(costs.values())
        # An option in use is confirmed before it is left, unless even its cheapest sample costs
        # FAR times the best confirmed one and `FAR_MS` more: noise does not do that (raw on a slow
        # link, measured once at the start, is not sent two more times to prove it while the arm
        # waits). It is then left once the options being confirmed are, so that the first switch
        # goes to the cheapest.
        others = [o for o in self._options.values() if o is not left and o.cost_ms]
        settled = all(self._confirmed(o) or not self._promising(o) for o in others)
        cheapest = min(left.latest, default=current)
        far = settled and cheapest >= FAR * best and cheapest >= best + FAR_MS
        if not (self._confirmed(left) or far):
            return
        target = next(q for q, c in costs.items() if c <= best * (1 + self.settings.tolerance))
        if target == self.current:
            return
        cheaper = current > costs[target] * (1 + self.settings.hysteresis) + self.settings.hysteresis_ms
        # Back to a better fidelity as soon as it costs no more than the tolerance allows.
        finer = self._rank[target] < self._rank[self.current] and costs[target] <= current * (
            1 + self.settings.tolerance
        )
        if cheaper or finer:
            # Flap damping: a switch soon after the previous one doubles the dwell, a late one halves it.
            recent = self.switches and since < 4 * max(self._dwell, self.settings.reprobe_every)
            dwell = self._dwell * 2 if recent else self._dwell // 2
            self._dwell = min(max(dwell, self.settings.min_dwell), self.settings.min_dwell * MAX_BACKOFF)
            self._switch(target)
            if far and not self._confirmed(left):  # hopeless already: due, and postponed (`_hopeless`)
                left.left_far = True
                left.due = self._request
                # The evidence that would bring it back is measured from now on.
                left.mbps_then = {q: m for q, o in self._options.items() if (m := o.mbps) is not None}

    def _decide_floor(self) -> None:
        """Starved: the best floor quality measured in time, else the lowest; else back to the best of the rest."""
        if self._starved():
            fits = [q for q, c in self._known(floor=True).items() if c < self.settings.starved_ms]
            target = fits[0] if fits else self._floor[-1]
        else:
            known = self._known(floor=False)
            target = next(q for q, c in known.items() if c <= min(known.values()) * (1 + self.settings.tolerance))
        if target != self.current:
            self._switch(target)

    def _switch(self, target: int) -> None:
        self.current = target
        self._last_switch = self._request
        self.switches += 1
        for option in self._options.values():
            option.interval = self.settings.reprobe_every
            option.due = self._request + option.interval

    def link_mbps(self) -> float | None:
        """Effective link throughput (Mbit/s): the most any option measured lately saw, if any."""
        recent = self._request - self.settings.reprobe_every * MAX_BACKOFF
        seen = [
            mbps
            for o in self._options.values()
            if (mbps := o.mbps) is not None and (o.sampled_at >= recent or o.quality == self.current)
        ]
        return max(seen, default=None)

    def status(self) -> CodecStatus:
        """Snapshot for status lines, summaries and metrics."""
        options = self._options.values()
        return CodecStatus(
            auto=self.auto,
            current=codec_name(self.current),
            link_mbps=self.link_mbps(),
            cost_ms={codec_name(o.quality): round(c, 3) for o in options if (c := o.cost) is not None},
            bytes={codec_name(o.quality): int(statistics.median(o.nbytes)) for o in options if o.nbytes},
            requests={codec_name(o.quality): o.requests for o in options},
            switches=self.switches,
            probes=self.probes,
            local=self.local,
        )
