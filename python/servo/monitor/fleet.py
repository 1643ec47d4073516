"""What a monitor knows about the fleet: robots from their telemetry, replicas from status and tokens.

It believes only what `servo.monitor.trust` vouches for: telemetry signed by an enrolled robot's
key (a stranger's is refused before any signature check, and nothing of it is kept; the checks
themselves are budgeted per robot and for the fleet, so a forger cannot make the monitor verify
without end), readable with the monitor's identity, and newer than every record seen of that robot; replicas whose
signed status a trusted identity made (the collector verifies it). So the robots and replicas
shown, and the ``/metrics`` series built from them, are bounded by what the fleet enrolled.

Every time shown to a person is on the monitor's own clock: a robot reports how long ago its
transitions happened (durations on its monotonic clock), a replica how long ago it served a
request, and the monitor places them relative to when the report arrived. No wall-clock instant
of another machine is ever compared with this one's.

A robot is live while its records come; ``stopped`` once its last record said goodbye (the run
ended on purpose); ``stale`` when records stopped for a few periods without one (a congested
link, a hiccup); ``crashed`` when they stopped for much longer without one (the process died or
its link did). The page's timeline ends in that state, from the moment it began.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from servo.monitor.trust import RobotTrust
from servo.server.admission import KeyedBuckets, TokenBucket
from servo.wire import EdgeTelemetry, StatusReply, WireError, fingerprint, open_telemetry, telemetry_signer
from servo.wire.telemetry import Reader, client_of_telemetry

#: A robot whose last record is older than this many periods (at least `MIN_STALE_S`) is stale.
STALE_PERIODS = 3
MIN_STALE_S = 3.0
#: ...and crashed past this many (at least `MIN_CRASHED_S`) without a goodbye.
CRASHED_PERIODS = 10
MIN_CRASHED_S = 10.0
#: An event equal to one of the last this many seconds (robot, kind, text) is counted on it.
EVENT_MERGE_S = 120.0
#: Fleet round trip over time: one point per this many seconds, this many kept.
FLEET_BUCKET_S = 5.0
FLEET_BUCKETS = 120
#: Per robot: transitions and samples kept for its timeline; fleet-wide: recent events.
ROBOT_TRANSITIONS = 200
ROBOT_SAMPLES = 600
FLEET_EVENTS = 200
#: Replicas whose token is gone are still shown as down this long (s).
REPLICA_FORGET_S = 300.0
#: Refusal events per robot and reason: at most one per this many seconds.
REFUSAL_EVENT_INTERVAL_S = 10.0
#: Liveliness tokens remembered of replicas whose status was not verified yet (newest kept).
PENDING_TOKENS = 1024
#: Records checked (signature, decryption: the costly part) per second per robot, and at once: a
#: robot sends one a second. A forger flooding under one name spends that name's budget only.
CHECKS_PER_ROBOT_S = 10.0
CHECK_BURST_PER_ROBOT = 20
#: Records checked per second for the whole fleet, and at once (2,000 robots at one a second).
CHECKS_PER_S = 2000.0
CHECK_BURST = 4000


@dataclass
class RobotView:
    """One robot as its telemetry shows it."""

    client_id: str
    fingerprint: str
    record: EdgeTelemetry
    seen_mono: float
    seen_wall: float
    #: (wall time on this clock, state, reason), oldest first.
    transitions: deque[tuple[float, str, str]] = field(default_factory=lambda: deque(maxlen=ROBOT_TRANSITIONS))
    #: (wall time, rtt p50 ms, rtt p99 ms, fallback ticks), one per record.
    samples: deque[tuple[float, float | None, float | None, int]] = field(
        default_factory=lambda: deque(maxlen=ROBOT_SAMPLES)
    )
    identity_changed: bool = False


@dataclass
class RttBucket:
    """The round trips robots reported within one `FLEET_BUCKET_S` (the fleet chart); owned by its `FleetView`."""

    start: float
    p50s: list[float] = field(default_factory=list)
    p99: float = 0.0


@dataclass
class ReplicaView:
    """One replica as its status replies and liveliness token show it."""

    prefix: str
    status: StatusReply | None = None
    alive: bool = False
    seen_mono: float = 0.0
    down_since_mono: float | None = None


class FleetView:
    """The monitor's picture of the fleet. Owned by the monitor's event loop.

    Args:
        trust: Which key may sign for which robot (`servo.monitor.trust`).
        reader: The monitor's identity: robots encrypt their records to it.
        clock: Monotonic seconds (injectable for tests).
        wall: This machine's wall clock in seconds (what the page shows).
    """

    def __init__(
        self,
        trust: RobotTrust,
        reader: Reader,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.trust = trust
        self.reader = reader
        #: Replica key prefixes whose liveliness token is there (bounded: anybody may declare one).
        self._tokens: dict[str, None] = {}
        self.robots: dict[str, RobotView] = {}
        self.replicas: dict[str, ReplicaView] = {}
        #: Records refused, by reason (malformed, unknown_robot, identity_changed, too_many_robots,
        #: rate, signature, unreadable, replay).
        self.refused: dict[str, int] = {}
        self.events: deque[dict[str, Any]] = deque(maxlen=FLEET_EVENTS)
        #: The fleet's round trips over time, oldest first.
        self.rtt: deque[RttBucket] = deque(maxlen=FLEET_BUCKETS)
        self._clock = clock
        self._wall = wall
        self._last_refusal: dict[tuple[str, str], float] = {}
        self._checks = KeyedBuckets(CHECKS_PER_ROBOT_S, CHECK_BURST_PER_ROBOT, clock=clock)
        self._all_checks = TokenBucket(CHECKS_PER_S, CHECK_BURST, clock)

    # ------------------------------------------------------------------ robots
    def on_telemetry(self, key: str, body: bytes, attachment: bytes | None) -> None:
        """A telemetry sample arrived: is its signer trusted, is it genuine, readable and fresh; then take it in."""
        try:
            robot, public_key = telemetry_signer(key, len(body), attachment)
        except WireError as exc:
            self._refuse(_robot_of(key), "malformed", str(exc))
            return
        verdict = self.trust.admit(robot, public_key)
        if verdict is not None:
            self._refuse(robot, verdict, f"telemetry refused: {verdict.replace('_', ' ')}")
            if verdict == "identity_changed" and robot in self.robots:
                self.robots[robot].identity_changed = True
            return
        if not (self._checks.take(robot) and self._all_checks.take()):
            self._refuse(robot, "rate", "telemetry refused: more records than the monitor checks per second")
            return
        try:
            record = open_telemetry(key, body, attachment, self.reader)
        except WireError as exc:
            text = str(exc)
            reason = "signature" if "signature" in text else "unreadable" if "reader" in text else "malformed"
            self._refuse(robot, reason, text)
            return
        if not self.trust.fresh(robot, record.run, record.seq):
            self._refuse(robot, "replay", "telemetry refused: replay")
            return
        now, wall = self._clock(), self._wall()
        view = self.robots.get(robot)
        if view is None:
            view = self.robots[robot] = RobotView(robot, fingerprint(public_key), record, now, wall)
            self.event(wall, robot, "join", f"first record ({'pinned' if self.trust.pinned(robot) else 'new'} key)")
        else:
            self._rejections(view.record, record, wall)
            view.record, view.seen_mono, view.seen_wall = record, now, wall
        for t in record.transitions:
            at = wall - t.age_ms / 1e3
            view.transitions.append((at, t.state, t.reason))
            self.event(at, robot, "transition", f"{t.state}: {t.reason}")
        if record.goodbye:
            self.event(wall, robot, "stop", f"stopped: {record.goodbye} (last state {record.state})")
        view.samples.append((wall, record.rtt_ms_p50, record.rtt_ms_p99, record.fallback_ticks))
        self._add_rtt(wall, record)

    def stale(self, view: RobotView) -> bool:
        """Whether ``view``'s robot has not reported for a while (several periods) without a goodbye."""
        return self.liveness(view)[0] in ("stale", "crashed")

    def liveness(self, view: RobotView) -> tuple[str, float | None]:
        """``live``, ``stopped``, ``stale`` or ``crashed`` (see the module docstring), and since when.

        The time is on this machine's wall clock; None while live.
        """
        period = view.record.period_ms / 1e3
        if view.record.goodbye:
            return "stopped", view.seen_wall
        silent = self._clock() - view.seen_mono
        stale_after = max(MIN_STALE_S, STALE_PERIODS * period)
        if silent <= stale_after:
            return "live", None
        crashed_after = max(MIN_CRASHED_S, CRASHED_PERIODS * period)
        if silent <= crashed_after:
            return "stale", view.seen_wall + stale_after
        return "crashed", view.seen_wall + crashed_after

    def _add_rtt(self, wall: float, record: EdgeTelemetry) -> None:
        if record.rtt_ms_p50 is None:
            return
        start = wall - wall % FLEET_BUCKET_S
        if not self.rtt or self.rtt[-1].start < start:
            self.rtt.append(RttBucket(start))
        bucket = self.rtt[-1] if self.rtt[-1].start == start else next(b for b in self.rtt if b.start == start)
        bucket.p50s.append(record.rtt_ms_p50)
        bucket.p99 = max(bucket.p99, record.rtt_ms_p99 or record.rtt_ms_p50)

    def _rejections(self, before: EdgeTelemetry, now: EdgeTelemetry, wall: float) -> None:
        for reason, count in now.chunks_rejected.items():
            if (new := count - before.chunks_rejected.get(reason, 0)) > 0:
                self.event(wall, now.client_id, "refusal", f"edge rejected {new} chunk(s): {reason}")

    def _refuse(self, robot: str, reason: str, text: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        now = self._clock()
        last = self._last_refusal.get((robot, reason))
        if last is None or now - last >= REFUSAL_EVENT_INTERVAL_S:
            if len(self._last_refusal) > 4 * FLEET_EVENTS:
                self._last_refusal.clear()  # bounded: an attacker may invent any number of names
            self._last_refusal[(robot, reason)] = now
            self.event(self._wall(), robot, "refusal", text)

    def unverified(self, replica: str, text: str) -> None:
        """A replica's answer that no trusted identity signed: counted, shown at most once per 10 s per name."""
        self._refuse(replica, "unverified", text)

    def event(self, at: float, robot: str, kind: str, text: str) -> None:
        """Add one fleet event (``kind``: join, transition, stop, refusal, replica) at ``at`` on this clock.

        One equal to an event of the last `EVENT_MERGE_S` (same robot, kind and text: a robot
        flapping between degraded and streaming) is counted on it and moved to ``at`` instead.
        """
        text = text[:300]
        for event in reversed(self.events):
            if at - event["t"] > EVENT_MERGE_S:
                break
            if (event["robot"], event["kind"], event["text"]) == (robot, kind, text):
                self.events.remove(event)
                event["count"] += 1
                event["t"] = max(event["t"], at)
                self.events.append(event)
                return
        self.events.append({"t": at, "first": at, "count": 1, "robot": robot, "kind": kind, "text": text})

    # ------------------------------------------------------------------ replicas
    def on_status(self, prefix: str, status: StatusReply) -> None:
        """A replica answered the status query (on its own key ``<prefix>/status``), signed by a trusted identity."""
        view = self.replicas.get(prefix)
        if view is None:
            view = self.replicas[prefix] = ReplicaView(prefix, alive=prefix in self._tokens)
            self.event(self._wall(), status.replica, "replica", "up" if view.alive else "verified")
        was = view.status
        view.status, view.seen_mono = status, self._clock()
        if was is not None and status.draining and not was.draining:
            self.event(self._wall(), status.replica, "replica", "draining")

    def on_replica_token(self, prefix: str, alive: bool) -> None:
        """A replica's liveliness token appeared or vanished (shown once its status is verified)."""
        self._tokens.pop(prefix, None)
        if alive:
            self._tokens[prefix] = None
            if len(self._tokens) > PENDING_TOKENS:
                self._tokens.pop(next(iter(self._tokens)))
        view = self.replicas.get(prefix)
        if view is None or view.alive == alive:
            return
        view.alive = alive
        view.down_since_mono = None if alive else self._clock()
        replica = prefix.rsplit("/", 1)[-1]
        self.event(self._wall(), replica, "replica", "up" if alive else "down (liveliness token gone)")

    def prune(self) -> None:
        """Forget replicas down for longer than `REPLICA_FORGET_S`."""
        now = self._clock()
        for prefix, view in list(self.replicas.items()):
            if view.down_since_mono is not None and now - view.down_since_mono > REPLICA_FORGET_S:
                del self.replicas[prefix]

    # ------------------------------------------------------------------ views for the page
    def snapshot(self) -> dict[str, Any]:
        """The fleet as JSON-able data (`servo.monitor.web` serves it)."""
        now = self._clock()
        return {
            "now": self._wall(),
            "replicas": [self._replica(view, now) for view in sorted(self.replicas.values(), key=lambda v: v.prefix)],
            "robots": [self._robot(view, now) for _, view in sorted(self.robots.items())],
            "events": sorted(reversed(self.events), key=lambda e: -e["t"])[:50],  # newest first
            "refused": dict(self.refused),
            "rtt": [
                {"t": b.start, "p50": statistics.median(b.p50s), "p99": b.p99, "robots": len(b.p50s)} for b in self.rtt
            ],
        }

    def timeline(self, robot: str) -> dict[str, Any] | None:
        """One robot's transitions and samples (its requests come from the replicas' audit)."""
        view = self.robots.get(robot)
        if view is None:
            return None
        transitions: list[dict[str, Any]] = [{"t": t, "state": s, "reason": r} for t, s, r in view.transitions]
        last = view.record.last_transition
        if last is not None and (not transitions or transitions[-1]["state"] != last.state):
            # Joined late (or a record with the transitions was lost): the newest record's state.
            at = view.seen_wall - last.age_ms / 1e3
            transitions = [t for t in transitions if t["t"] < at]
            transitions.append({"t": at, "state": last.state, "reason": last.reason})
        state, since = self.liveness(view)
        if state == "crashed":  # stale first, then crashed: as the page showed it meanwhile
            stale_after = max(MIN_STALE_S, STALE_PERIODS * view.record.period_ms / 1e3)
            transitions.append({"t": view.seen_wall + stale_after, "state": "stale", "reason": "no record"})
        if since is not None:
            how = view.record.goodbye if state == "stopped" else "no record and no goodbye"
            transitions.append({"t": since, "state": state, "reason": how})
        return {
            "robot": self._robot(view, self._clock()),
            "transitions": transitions,
            "samples": [{"t": t, "rtt_p50": p50, "rtt_p99": p99, "fallback": fb} for t, p50, p99, fb in view.samples],
        }

    def _robot(self, view: RobotView, now: float) -> dict[str, Any]:
        r = view.record
        last = r.last_transition
        liveness, since = self.liveness(view)
        return {
            "id": view.client_id,
            "state": r.state,
            "status": r.state if liveness == "live" else liveness,
            "since": since,
            "goodbye": r.goodbye,
            "stale": liveness in ("stale", "crashed"),
            "age_s": round(now - view.seen_mono, 3),
            "replica": r.replica,
            "model": r.model,
            "rtt_p50": r.rtt_ms_p50,
            "rtt_p99": r.rtt_ms_p99,
            "delay_steps": r.delay_steps,
            "queue_depth": r.queue_depth,
            "fallback_ticks": r.fallback_ticks,
            "lateness_p99": r.tick_lateness_ms_p99,
            "missed_deadlines": r.missed_deadlines,
            "codec": r.codec,
            "requests": r.requests,
            "reconnects": r.reconnects,
            "chunks_rejected": dict(r.chunks_rejected),
            "last_transition": None if last is None else {"state": last.state, "reason": last.reason},
            "fingerprint": view.fingerprint,
            "pinned": self.trust.pinned(view.client_id),
            "identity_changed": view.identity_changed,
        }

    def _replica(self, view: ReplicaView, now: float) -> dict[str, Any]:
        s = view.status
        app, model, replica = view.prefix.split("/")[1:4]
        live = s if view.alive else None  # a down replica's last figures are not its figures now
        return {
            "key": view.prefix,
            "app": app,
            "model": model,
            "replica": replica,
            "up": view.alive,
            "revision": None if s is None else s.policy.revision,
            "sessions": None if live is None else live.active_sessions,
            "max_sessions": None if s is None else s.max_sessions,
            "load": None if live is None else live.load,
            "queue_wait_ms": None if live is None else live.queue_wait_ms,
            "draining": bool(live is not None and live.draining),
            "warmed_up": bool(live is not None and live.warmed_up),
            "status_age_s": None if s is None else round(now - view.seen_mono, 3),
            "down_s": None if view.down_since_mono is None else round(now - view.down_since_mono, 3),
        }


def _robot_of(key: str) -> str:
    try:
        return client_of_telemetry(key)
    except WireError:
        return "?"
