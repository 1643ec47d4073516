"""Grouping rules of the schedulers and the worker's service order, on their own (no server, no clock)."""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass

import pytest

from servo.server.scheduler import DeadlineBatcher, ForwardCost, RoundRobin, ServiceOrder, scheduler_for
from tests.server.policies import BatchingFixedPolicy, FixedComputePolicy

MS = 1_000_000


@dataclass(frozen=True)
class Entry:
    name: str
    key: Hashable = "same"
    deadline_ns: int | None = None


def cost(base_ms: float, per_sample_ms: float) -> ForwardCost:
    """A cost model that has seen batches of 1 and 4 of t(b) = base + per_sample * b."""
    model = ForwardCost()
    for b in (1, 4):
        model.record(b, (base_ms + per_sample_ms * b) / 1e3)
    return model


def names(group: list[Entry]) -> list[str]:
    return [e.name for e in group]


def test_round_robin_serves_the_head_alone() -> None:
    ready = [Entry("a"), Entry("b")]
    assert names(RoundRobin().select(ready, 0)) == ["a"]
    assert RoundRobin().select([], 0) == []


def test_batcher_groups_compatible_shapes_only() -> None:
    ready = [Entry("a"), Entry("b", key="other"), Entry("c"), Entry("d", key="other")]
    assert names(DeadlineBatcher(8, cost=cost(20, 2)).select(ready, 0)) == ["a", "c"]


def test_batcher_stops_at_max_batch() -> None:
    ready = [Entry(str(i)) for i in range(10)]
    assert names(DeadlineBatcher(4, cost=cost(20, 2)).select(ready, 0)) == ["0", "1", "2", "3"]


def test_batcher_never_puts_a_members_deadline_at_risk() -> None:
    # t(b) = 20 + 2 b ms: a batch of 3 ends at 26 ms, of 4 at 28 ms, of 5 at 30 ms.
    ready = [
        Entry("a", deadline_ns=100 * MS),
        Entry("b"),  # no deadline: never limits the group
        Entry("c", deadline_ns=27 * MS),
        Entry("d", deadline_ns=500 * MS),  # would push the batch to 28 ms: c would miss
        Entry("e"),
    ]
    group = DeadlineBatcher(16, cost=cost(20, 2)).select(ready, 0)
    assert names(group) == ["a", "b", "c"]
    # Nobody in the group is late with what the model predicts for its size (26 ms).
    assert all(e.deadline_ns is None or e.deadline_ns >= 26 * MS for e in group)


def test_a_member_that_cannot_make_it_is_left_for_the_next_forward() -> None:
    ready = [Entry("a", deadline_ns=200 * MS), Entry("b", deadline_ns=10 * MS), Entry("c")]
    # b would be late even alone with a: it is not added (and the group ends there).
    assert names(DeadlineBatcher(16, cost=cost(20, 2)).select(ready, 0)) == ["a"]


def test_the_head_is_served_even_when_late() -> None:
    ready = [Entry("a", deadline_ns=1 * MS), Entry("b")]
    assert names(DeadlineBatcher(16, cost=cost(20, 2)).select(ready, 50 * MS)) == ["a"]


def test_deadlines_with_no_cost_measured_yet_keep_the_head_alone() -> None:
    ready = [Entry("a", deadline_ns=10**12), Entry("b")]
    assert names(DeadlineBatcher(16).select(ready, 0)) == ["a"]
    assert names(DeadlineBatcher(16).select([Entry("a"), Entry("b")], 0)) == ["a", "b"]


def test_round_robin_never_lingers() -> None:
    assert RoundRobin().linger_s([Entry("a")], 8, 0, 0) == 0


def test_a_small_group_lingers_until_its_linger_budget_is_spent() -> None:
    batcher = DeadlineBatcher(16, linger_ms=5, cost=cost(20, 2))
    group = [Entry("a"), Entry("b")]
    assert batcher.linger_s(group, 8, 10 * MS, 12 * MS) == pytest.approx(0.003)
    assert batcher.linger_s(group, 8, 10 * MS, 15 * MS) == 0
    assert DeadlineBatcher(16, cost=cost(20, 2)).linger_s(group, 8, 10 * MS, 10 * MS) == 0  # no linger configured


def test_a_group_that_cannot_grow_does_not_linger() -> None:
    batcher = DeadlineBatcher(2, linger_ms=5, cost=cost(20, 2))
    assert batcher.linger_s([Entry("a"), Entry("b")], 8, 0, 0) == 0  # full
    assert DeadlineBatcher(16, linger_ms=5).linger_s([Entry("a"), Entry("b")], 2, 0, 0) == 0  # everybody is in it


def test_lingering_never_puts_a_deadline_at_risk() -> None:
    batcher = DeadlineBatcher(16, linger_ms=5, cost=cost(20, 2))
    # A batch of 3 takes 26 ms: to end by 28 ms it must start by 2 ms.
    group = [Entry("a", deadline_ns=28 * MS), Entry("b")]
    assert batcher.linger_s(group, 8, 0, 0) == pytest.approx(0.002)
    assert batcher.linger_s(group, 8, 0, 3 * MS) == 0
    assert DeadlineBatcher(16, linger_ms=5).linger_s(group, 8, 0, 0) == 0  # no cost measured: no risk taken


def test_cost_model_learns_a_line_and_is_pessimistic_from_one_size() -> None:
    model = ForwardCost()
    assert model.predict(1) is None
    model.record(1, 0.022)
    assert model.predict(1) == pytest.approx(0.022)
    assert model.predict(8) == pytest.approx(8 * 0.022)  # one size seen: assume batching saves nothing
    model.record(4, 0.028)
    assert model.predict(16) == pytest.approx(0.052)
    assert model.predict(2) == pytest.approx(0.024)


def test_only_a_chunk_stateless_batching_policy_served_shared_is_batched() -> None:
    batcher = scheduler_for(BatchingFixedPolicy().spec, batching=True, exclusive=False, max_batch=8, linger_ms=3)
    assert isinstance(batcher, DeadlineBatcher)
    assert (batcher.max_batch, batcher.linger_ns) == (8, 3 * MS)
    spec = BatchingFixedPolicy().spec
    assert isinstance(scheduler_for(spec, batching=True, exclusive=True, max_batch=8), RoundRobin)
    assert isinstance(scheduler_for(spec, batching=True, exclusive=False, max_batch=1), RoundRobin)
    stateful = BatchingFixedPolicy(chunk_stateless=False)
    assert isinstance(scheduler_for(stateful.spec, batching=True, exclusive=False, max_batch=8), RoundRobin)
    assert isinstance(
        scheduler_for(FixedComputePolicy().spec, batching=False, exclusive=False, max_batch=8), RoundRobin
    )


@dataclass(eq=False)
class Job:
    session: str
    first: bool = False


def order(queue: ServiceOrder[Job]) -> list[str]:
    return [job.session for job in queue]


def test_a_sessions_first_request_goes_ahead_of_the_established_in_arrival_order() -> None:
    queue: ServiceOrder[Job] = ServiceOrder()
    for job in (Job("a"), Job("b"), Job("new-1", True), Job("c"), Job("new-2", True)):
        queue.push(job, first=job.first, limit=8)
    assert order(queue) == ["new-1", "new-2", "a", "b", "c"]
    assert queue.head().session == "new-1"
    queue.remove(queue.head())
    assert order(queue) == ["new-2", "a", "b", "c"]
    with pytest.raises(ValueError, match="not queued"):
        queue.remove(Job("a"))  # an equal job, not the queued one


def test_a_waiting_entry_lets_at_most_limit_first_requests_by() -> None:
    queue: ServiceOrder[Job] = ServiceOrder()
    queue.push(Job("a"), first=False, limit=2)
    for name in ("new-1", "new-2", "new-3"):
        queue.push(Job(name, True), first=True, limit=2)
    assert order(queue) == ["new-1", "new-2", "a", "new-3"]
    queue.push(Job("b"), first=False, limit=2)
    queue.push(Job("new-4", True), first=True, limit=2)
    assert order(queue) == ["new-1", "new-2", "a", "new-3", "new-4", "b"]  # b has let one by


def test_newcomers_at_every_turn_never_keep_an_established_session_waiting_past_two_cycles() -> None:
    """A round-robin worker (one entry per session queued, the head served each turn) under a
    flood of new sessions, each served once and closed: as many open at every turn as
    ``max_sessions`` allows. Every established request is served within two cycles, and every
    established session keeps half its share or more."""
    rng = random.Random(19)
    established = [f"robot-{i}" for i in range(6)]
    max_sessions, turns = 10, 2000
    queue: ServiceOrder[Job] = ServiceOrder()
    pushed_at: dict[int, int] = {}  # id(job) -> the turn it was queued
    newcomers = served_new = 0
    served: dict[str, int] = dict.fromkeys(established, 0)
    idle = set(established)
    for turn in range(turns):
        open_new = sum(1 for job in queue if job.first)
        for _ in range(max_sessions - len(established) - open_new):  # every free session slot, at once
            newcomers += 1
            job = Job(f"new-{newcomers}", True)
            pushed_at[id(job)] = turn
            open_new += 1
            queue.push(job, first=True, limit=len(established) + open_new)
        for name in sorted(idle):
            if rng.random() < 0.7:  # back from its round trip
                job = Job(name)
                pushed_at[id(job)] = turn
                queue.push(job, first=False, limit=len(established) + open_new)
                idle.discard(name)
        job = queue.head()
        queue.remove(job)
        since = pushed_at.pop(id(job))
        if job.first:
            served_new += 1
        else:
            assert turn - since <= 2 * max_sessions - 1, (job.session, turn - since)
            served[job.session] += 1
            idle.add(job.session)
    assert served_new > turns / 2  # the newcomers did go first most of the time
    # Half its share without newcomers (one turn in max_sessions), less its own round trips.
    assert min(served.values()) >= turns / (2 * max_sessions + 4), served
