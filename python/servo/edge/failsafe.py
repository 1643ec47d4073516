"""The edge's fail-safe state machine (docs/design/failsafe.md).

::

    CONNECTING ──first merge──► STREAMING ──queue runs dry before the chunk is due──► DEGRADED
         ▲                        ▲    │ control loop starved (queue empty / stale)  │
         │ re-handshake           │    └──────────────► STALLED ◄──────────────────────┘
         │                        └── merge ─────────────┘
    RECONNECTING ◄── timeout streak / server liveliness lost / drain notice
         │ offline > max_offline_s, or the server came back with another model
         ▼
        DEAD  (safe teardown)

DEGRADED is a forecast, so it comes before STALLED: a request is outstanding and the actions
left in the queue end before its chunk is expected back (sent + the expected round trip, and for
an overdue request no sooner than `DRY_MARGIN_S` from now), or it is outstanding longer than
``degraded_after_s`` whatever the queue holds.

Watchdogs are layered: the per-request timeout catches a hung server, liveliness a dead
server or router, and the staleness bound (enforced by the control loop itself) holds
whatever the cause.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Annotated, NamedTuple

import msgspec

from servo.config import PositiveInt, Seconds, doc
from servo.logs import get_logger

log = get_logger(__name__)


class EngineState(enum.Enum):
    """Where the engine is in the fail-safe state machine."""

    CONNECTING = "connecting"
    STREAMING = "streaming"
    DEGRADED = "degraded"
    STALLED = "stalled"
    RECONNECTING = "reconnecting"
    DEAD = "dead"


#: An overdue request is expected back no sooner than this from now: the state machine is
#: evaluated every 20 ms, and DEGRADED must show before the control loop starves.
DRY_MARGIN_S = 0.05


class Transition(NamedTuple):
    """One transition of the state machine: the state entered, why, and when (monotonic ns)."""

    state: EngineState
    reason: str
    mono_ns: int


_LIVE = (EngineState.STREAMING, EngineState.DEGRADED, EngineState.STALLED)
#: Transitions kept for the run summary: a link that flaps for hours must not grow memory.
MAX_TRANSITIONS = 1000


class FailSafeConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[failsafe]`` of the edge configuration: the watchdogs (the engine times each request out)."""

    degraded_after_s: Annotated[
        Seconds, doc("A request outstanding this long -> DEGRADED, even with actions queued (s).")
    ] = 1.0
    request_timeout_s: Annotated[Seconds, doc("Per-request watchdog: a hung server (s).")] = 5.0
    timeout_streak: Annotated[PositiveInt, doc("Request timeouts in a row that count as a lost server.")] = 2
    max_offline_s: Annotated[Seconds, doc("Offline this long -> DEAD: park the arm and exit (s).")] = 60.0


class FailSafe:
    """The state machine.

    Transitions are driven by the engine's worker; the control loop only reads `state` and `dead`.

    Args:
        config: The watchdogs: ``degraded_after_s``, ``timeout_streak``, ``max_offline_s`` (the
            time without a merged chunk after which a disconnected edge gives up).
        clock: Monotonic clock in ns (injectable for tests).
    """

    def __init__(self, config: FailSafeConfig, *, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.config = config
        self._degraded_ns = round(config.degraded_after_s * 1e9)
        self._streak = config.timeout_streak
        self._max_offline_ns = round(config.max_offline_s * 1e9)
        self._clock = clock
        self.state = EngineState.CONNECTING
        self.reason = ""
        self.dead = threading.Event()
        #: The last `MAX_TRANSITIONS` transitions, oldest first.
        self.transitions: deque[Transition] = deque(
            [Transition(EngineState.CONNECTING, "start", clock())], maxlen=MAX_TRANSITIONS
        )
        #: Transitions ever made (the start included): a reader that remembers it knows which are new.
        self.transition_count = 1
        self.reconnects = 0
        self.timeouts = 0
        self._timeouts_in_row = 0
        self._last_good_ns = clock()
        self._request_out_ns: int | None = None
        #: Why each STALLED transition happened (the engine's diagnosis) -> how many times.
        self.stall_causes: Counter[str] = Counter()

    def _go(self, state: EngineState, reason: str) -> None:
        if state is self.state or self.state is EngineState.DEAD:
            return
        log.info("engine state", state=state.value, previous=self.state.value, reason=reason)
        self.state = state
        self.reason = reason
        self.transitions.append(Transition(state, reason, self._clock()))
        self.transition_count += 1
        if state is EngineState.DEAD:
            self.dead.set()

    # ------------------------------------------------------------------ events
    def session_opened(self) -> None:
        """Handshake done; streaming starts with the first merged chunk."""
        self._go(EngineState.CONNECTING, "session open")

    def outstanding_ns(self) -> int | None:
        """How long the request in flight has been out (ns); None when none is."""
        return None if self._request_out_ns is None else self._clock() - self._request_out_ns

    def request_sent(self) -> None:
        """An observation left; the degraded watchdog starts."""
        self._request_out_ns = self._clock()

    def merged(self) -> None:
        """A chunk was merged: the link is good."""
        self._request_out_ns = None
        self._timeouts_in_row = 0
        self._last_good_ns = self._clock()
        self._go(EngineState.STREAMING, "chunk merged")

    def request_failed(self) -> None:
        """The server answered with an error: not a link problem, but no fresh actions."""
        self._request_out_ns = None

    def request_timed_out(self) -> bool:
        """A request got no answer; returns True when the streak says the server is gone."""
        self._request_out_ns = None
        self.timeouts += 1
        self._timeouts_in_row += 1
        return self._timeouts_in_row >= self._streak

    def lost(self, reason: str) -> None:
        """Server gone (timeouts, liveliness, drain): reconnect."""
        if self.state in (*_LIVE, EngineState.CONNECTING):
            self.reconnects += 1
        self._request_out_ns = None
        self._timeouts_in_row = 0
        self._go(EngineState.RECONNECTING, reason)

    def fatal(self, reason: str) -> None:
        """A contract violation (e.g. the server came back with another model): never recover."""
        self._go(EngineState.DEAD, reason)

    def transitions_since(self, count: int) -> list[Transition]:
        """The transitions made after the first ``count`` (those still kept), oldest first.

        On the thread that drives the transitions (the event loop): a reader keeps
        `transition_count` and asks for what came after it.
        """
        kept = self.transitions
        new = self.transition_count - count
        return list(kept)[max(0, len(kept) - new) :] if new > 0 else []

    def tick(
        self,
        *,
        starved_since_ns: int,
        runway_ns: int | None = None,
        expected_rtt_ns: int | None = None,
        why_starved: Callable[[], str] | None = None,
    ) -> EngineState:
        """Periodic evaluation.

        Args:
            starved_since_ns: When the control loop last had no fresh action (0 = never).
            runway_ns: How long the queued actions last (None: unknown).
            expected_rtt_ns: The round trip a request is expected to take (None: no estimate yet).
            why_starved: Says why the queue ran dry, asked once per STALLED transition: the
                transition's reason and `stall_causes` carry it.
        """
        now = self._clock()
        if self.state in (EngineState.CONNECTING, EngineState.RECONNECTING):
            if now - self._last_good_ns > self._max_offline_ns:
                self._go(EngineState.DEAD, f"offline for more than {self._max_offline_ns / 1e9:g} s")
            return self.state
        if self.state not in _LIVE:
            return self.state
        if starved_since_ns > self._last_good_ns:
            if self.state is not EngineState.STALLED:
                cause = why_starved() if why_starved is not None else ""
                self.stall_causes[cause or "unknown"] += 1
                self._go(EngineState.STALLED, "no fresh action for the control loop" + (f": {cause}" if cause else ""))
        elif self.state is EngineState.STREAMING and self._request_out_ns is not None:
            outstanding = now - self._request_out_ns
            if outstanding > self._degraded_ns:
                self._go(EngineState.DEGRADED, "request outstanding too long")
            elif (
                runway_ns is not None
                and expected_rtt_ns is not None
                and runway_ns < max(expected_rtt_ns - outstanding, round(DRY_MARGIN_S * 1e9))
            ):
                self._go(EngineState.DEGRADED, "the queue runs dry before the chunk is expected back")
        return self.state
