"""The audit log is independent of the console log configuration."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from servo.logs import configure_logging
from servo.server.audit import AuditLog, RecentRequests
from servo.wire import AuditEntry, AuditQuery


@pytest.fixture
def quiet_console() -> Iterator[None]:
    """``servo-serve --log-level warning``: the global structlog config filters out info."""
    saved = structlog.get_config()
    configure_logging("warning")
    try:
        yield
    finally:
        structlog.configure(**saved)


@pytest.mark.usefixtures("quiet_console")
def test_audit_lines_are_written_whatever_the_log_level(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(str(path))
    audit.write(
        session_id="ab" * 16,
        client_id="c",
        seq_id=2,
        episode_id=0,
        queue_wait_ms=0.1,
        inference_ms=20.0,
        staleness_ms=21.5,
        outcome="ok",
    )
    audit.close()
    (line,) = path.read_text().splitlines()
    record = json.loads(line)
    assert record["event"] == "request"
    assert (record["session_id"], record["seq_id"], record["outcome"]) == ("ab" * 16, 2, "ok")
    assert record["staleness_ms"] == 21.5
    assert "timestamp" in record


def test_disabled_audit_writes_nothing(tmp_path: Path) -> None:
    audit = AuditLog("")
    audit.write(
        session_id="00" * 16,
        client_id="c",
        seq_id=1,
        episode_id=0,
        queue_wait_ms=0,
        inference_ms=0,
        staleness_ms=0,
        outcome="ok",
    )
    audit.close()
    assert list(tmp_path.iterdir()) == []
    assert [e.seq_id for e in audit.recent.tail(AuditQuery("c"))] == [1]  # monitors still see it


def entry(client: str, seq: int, outcome: str = "ok") -> AuditEntry:
    return AuditEntry(client, "00" * 16, seq, 0, outcome, 1.0, 2.0, 3.5, 0, 0.0)


def test_recent_requests_are_bounded_per_client_and_in_clients() -> None:
    recent = RecentRequests(per_client=3, clients=2)
    for seq in range(5):
        recent.add(entry("a", seq), now_ns=seq * 1_000_000)
    recent.add(entry("b", 0), now_ns=10_000_000)
    assert [e.seq_id for e in recent.tail(AuditQuery("a"), now_ns=20_000_000)] == [2, 3, 4]
    recent.add(entry("c", 0), now_ns=11_000_000)  # a third client: the least recently served goes
    assert recent.tail(AuditQuery("a")) == []
    assert [e.client_id for e in recent.tail(AuditQuery())] == ["b", "c"]


def test_recent_requests_tail_filters_limits_and_ages() -> None:
    recent = RecentRequests()
    recent.add(entry("a", 1), now_ns=1_000_000)
    recent.add(entry("b", 1, "rate_limited"), now_ns=2_000_000)
    recent.add(entry("a", 2, "inference_failed"), now_ns=3_000_000)
    recent.add(entry("a", 3), now_ns=4_000_000)
    every = recent.tail(AuditQuery(), now_ns=10_000_000)
    assert [(e.client_id, e.seq_id) for e in every] == [("a", 1), ("b", 1), ("a", 2), ("a", 3)]
    assert [e.age_ms for e in every] == [9.0, 8.0, 7.0, 6.0]
    errors = recent.tail(AuditQuery(errors_only=True), now_ns=10_000_000)
    assert [(e.client_id, e.outcome) for e in errors] == [("b", "rate_limited"), ("a", "inference_failed")]
    assert [e.seq_id for e in recent.tail(AuditQuery("a", limit=2))] == [2, 3]


def test_a_refusal_pushed_out_of_its_ring_is_no_longer_reported() -> None:
    recent = RecentRequests(per_client=2)
    for seq, outcome in enumerate(["rate_limited", "ok", "ok"]):  # the refusal falls out of the ring
        recent.add(entry("a", seq, outcome))
    recent.add(entry("b", 0))
    assert recent.tail(AuditQuery(errors_only=True)) == []
    for seq, outcome in enumerate(["inference_failed", "stale_observation", "ok"], start=3):
        recent.add(entry("a", seq, outcome))  # two refusals, then the older one falls out
    errors = recent.tail(AuditQuery(errors_only=True))
    assert [(e.client_id, e.seq_id, e.outcome) for e in errors] == [("a", 4, "stale_observation")]
