"""Which of the decoded observations the inference worker serves in its next forward.

The worker keeps what it took from the mailboxes in a `ServiceOrder`: arrival (ring) order,
except that a session's first request goes ahead of the established sessions' requests, within
a bound that keeps every session served at least once per two cycles. It asks its `Scheduler`
for the next group: the head of that queue is always in it, so every session is served however
fast another one sends. `RoundRobin` serves the head alone; `DeadlineBatcher` adds later entries
of compatible shapes as long as the bigger forward puts no member's deadline at risk, for
policies with ``predict_chunk_batch``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterator, Sequence
from typing import Generic, Protocol, TypeVar

from servo.policy import PolicySpec

#: Forward times remembered per batch size: exponential average with this weight on the newest.
_COST_WEIGHT = 0.2


class Candidate(Protocol):
    """A decoded observation as the scheduler sees it."""

    @property
    def key(self) -> Hashable:
        """Equal for observations whose tensors stack (state and camera shapes)."""
        ...

    @property
    def deadline_ns(self) -> int | None:
        """Monotonic instant the client expects the chunk by; None when it said nothing."""
        ...


C = TypeVar("C", bound=Candidate)


E = TypeVar("E")


class _Slot(Generic[E]):
    """An entry of a `ServiceOrder` and how often a first request went ahead of it."""

    __slots__ = ("entry", "first", "overtaken")

    def __init__(self, entry: E, first: bool) -> None:
        self.entry = entry
        self.first = first
        self.overtaken = 0


class ServiceOrder(Generic[E]):
    """The inference worker's queue: arrival order, a session's first request ahead.

    A session that just opened has nothing to act on yet (or, after a failover, only what is left
    of the dead replica's chunk), while an established session's robot still executes its last
    chunk: its first request overtakes the waiting requests of established sessions, in arrival
    order among first requests. A waiting entry lets no more first requests by than there are
    sessions open (``limit``), and the queue holds at most one entry per session: an established
    request waits at most two cycles of the sessions open, however many newcomers arrive. A
    session has one first request and opens are rate limited per client
    (``limits.client_opens_per_s``), so nobody can buy priority by asking often. Owned by the
    inference worker thread.
    """

    def __init__(self) -> None:
        self._slots: deque[_Slot[E]] = deque()

    def __len__(self) -> int:
        return len(self._slots)

    def __iter__(self) -> Iterator[E]:
        return (slot.entry for slot in self._slots)

    def head(self) -> E:
        """The entry served next (the queue must not be empty)."""
        return self._slots[0].entry

    def push(self, entry: E, *, first: bool, limit: int) -> None:
        """Queue ``entry`` at the back, or a session's ``first`` request further ahead.

        A first request goes ahead of the established entries at the back that have let fewer
        than ``limit`` (the sessions open now) first requests by.
        """
        slot = _Slot(entry, first)
        position = len(self._slots)
        if first:
            while position > 0:
                ahead = self._slots[position - 1]
                if ahead.first or ahead.overtaken >= limit:
                    break
                position -= 1
            for index in range(position, len(self._slots)):
                self._slots[index].overtaken += 1
        self._slots.insert(position, slot)

    def remove(self, entry: E) -> None:
        """Take ``entry`` out (it is being served or dropped)."""
        for index, slot in enumerate(self._slots):
            if slot.entry is entry:
                del self._slots[index]
                return
        raise ValueError("entry not queued")


class Scheduler(Protocol):
    """Picks the next group to serve. Called by the inference worker thread only."""

    @property
    def max_batch(self) -> int:
        """Most observations in one group: the worker waits for the decodes of that many."""
        ...

    def select(self, ready: Sequence[C], now_ns: int) -> list[C]:
        """The group to serve now: ``ready[0]`` (the longest waiting) and maybe more of ``ready``."""
        ...

    def linger_s(self, group: Sequence[C], sessions: int, since_ns: int, now_ns: int) -> float:
        """How long to wait for more observations before serving ``group`` (0: serve it now).

        ``sessions`` is how many sessions are open: more cannot come. ``since_ns`` is when the
        group could first have been served: the later of its head's arrival and the end of the
        last forward.
        """
        ...

    def record(self, size: int, seconds: float) -> None:
        """A forward of ``size`` observations took ``seconds`` (pre- and post-processing included)."""
        ...


class RoundRobin:
    """One observation per forward, in ring order: what chunk-stateful or non-batching policies get.

    Owned by the inference worker thread.
    """

    max_batch = 1

    def select(self, ready: Sequence[C], now_ns: int) -> list[C]:
        """The head alone."""
        return list(ready[:1])

    def linger_s(self, group: Sequence[C], sessions: int, since_ns: int, now_ns: int) -> float:
        """Never waits."""
        return 0.0

    def record(self, size: int, seconds: float) -> None:
        """Nothing to learn."""


class ForwardCost:
    """Predicted forward time per batch size, learned from the forwards served.

    A size never served is extrapolated from the sizes seen: a line through them when there are
    two or more, otherwise the pessimistic guess that batching saves nothing. Owned by the
    inference worker thread.
    """

    def __init__(self) -> None:
        self._seconds: dict[int, float] = {}

    def record(self, size: int, seconds: float) -> None:
        """Fold one measured forward into the average of its size."""
        old = self._seconds.get(size)
        self._seconds[size] = seconds if old is None else old + _COST_WEIGHT * (seconds - old)

    def predict(self, size: int) -> float | None:
        """Seconds a forward of ``size`` is expected to take; None before any forward was measured."""
        if size in self._seconds:
            return self._seconds[size]
        if not self._seconds:
            return None
        if len(self._seconds) == 1:
            ((seen, seconds),) = self._seconds.items()
            return seconds * max(1.0, size / seen)
        # Least squares t = a + c * b over the sizes seen; never a negative per-sample cost.
        points = list(self._seconds.items())
        mean_b = sum(b for b, _ in points) / len(points)
        mean_t = sum(t for _, t in points) / len(points)
        var = sum((b - mean_b) ** 2 for b, _ in points)
        slope = max(0.0, sum((b - mean_b) * (t - mean_t) for b, t in points) / var)
        return max(0.0, mean_t + slope * (size - mean_b))


class DeadlineBatcher:
    """Groups compatible observations into one forward while every member still makes its deadline.

    Starting from the head, each later entry with the head's ``key`` joins (up to ``max_batch``)
    if the predicted time of the grown forward still ends before every member's deadline; the
    first one that would put a deadline at risk ends the group (it and those after it go next).
    Members without a deadline never limit the group. The head is served even when it is late
    already: waiting longer helps nobody.

    A group smaller than it could be (fewer than ``max_batch`` and than the sessions open) may
    linger for more: at most ``linger_ms`` after it could first have been served, and never past
    the instant the grown forward would have to start for every member to make its deadline.
    Replies of one batch reach their clients a little apart, so their next observations do too;
    without the linger, the sessions split into groups that alternate on the device, each paying
    the forward's fixed cost. Owned by the inference worker thread.

    Args:
        max_batch: Most observations in one forward.
        linger_ms: Longest an observation waits for partners (keep it well under a control period).
        cost: Forward-time model (learned from `record` when not given).
    """

    def __init__(self, max_batch: int, *, linger_ms: float = 0.0, cost: ForwardCost | None = None) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.max_batch = max_batch
        self.linger_ns = int(linger_ms * 1e6)
        self.cost = cost or ForwardCost()

    def select(self, ready: Sequence[C], now_ns: int) -> list[C]:
        """The head and the compatible entries after it that fit (see the class docstring)."""
        if not ready:
            return []
        head = ready[0]
        group = [head]
        key, earliest = head.key, head.deadline_ns
        for entry in ready[1:]:
            if len(group) == self.max_batch:
                break
            if entry.key != key:
                continue
            deadline = entry.deadline_ns
            tightest = deadline if earliest is None else earliest if deadline is None else min(earliest, deadline)
            if tightest is not None:
                seconds = self.cost.predict(len(group) + 1)
                if seconds is None or now_ns + int(seconds * 1e9) > tightest:
                    break
            group.append(entry)
            earliest = tightest
        return group

    def linger_s(self, group: Sequence[C], sessions: int, since_ns: int, now_ns: int) -> float:
        """Time left to wait for partners (see the class docstring)."""
        if not group or len(group) >= min(self.max_batch, sessions):
            return 0.0
        until = since_ns + self.linger_ns
        deadlines = [e.deadline_ns for e in group if e.deadline_ns is not None]
        if deadlines:
            seconds = self.cost.predict(len(group) + 1)
            if seconds is None:
                return 0.0
            until = min(until, min(deadlines) - int(seconds * 1e9))
        return max(0.0, (until - now_ns) / 1e9)

    def record(self, size: int, seconds: float) -> None:
        """Teach the cost model."""
        self.cost.record(size, seconds)


def scheduler_for(
    spec: PolicySpec, *, batching: bool, exclusive: bool, max_batch: int, linger_ms: float = 0.0
) -> Scheduler:
    """Batches for a chunk-stateless ``batching`` policy (`BatchingPolicy`) served shared; round-robin otherwise."""
    if exclusive or max_batch < 2 or not spec.chunk_stateless or not batching:
        return RoundRobin()
    return DeadlineBatcher(max_batch, linger_ms=linger_ms)
