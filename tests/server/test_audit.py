"""The audit log is independent of the console log configuration."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from servo.logs import configure_logging
from servo.server.audit import AuditLog


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
    audit.write(session_id=1, client_id="c", seq_id=2, episode_id=0, queue_wait_ms=0.1, inference_ms=20.0, outcome="ok")
    audit.close()
    (line,) = path.read_text().splitlines()
    record = json.loads(line)
    assert record["event"] == "request"
    assert (record["session_id"], record["seq_id"], record["outcome"]) == (1, 2, "ok")
    assert "timestamp" in record


def test_disabled_audit_writes_nothing(tmp_path: Path) -> None:
    audit = AuditLog("")
    audit.write(session_id=1, outcome="ok")
    audit.close()
    assert list(tmp_path.iterdir()) == []
