"""One structured JSON line per served request (seeds/001 §12), joinable with edge recordings on
(session_id, seq_id)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, Any

import structlog


class AuditLog:
    """Appends JSON lines to a file (or stdout for ``"-"``; disabled for ``""``).

    Written from the inference worker thread only.
    """

    def __init__(self, path: str) -> None:
        self._file: IO[str] | None = None
        if not path:
            self._log = None
            return
        self._file = sys.stdout if path == "-" else Path(path).open("a", buffering=1)  # noqa: SIM115
        self._log = structlog.wrap_logger(
            structlog.WriteLogger(self._file),
            processors=[
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.JSONRenderer(),
            ],
        )

    def write(self, **fields: Any) -> None:
        """One line: session_id, client_id, seq_id, episode_id, queue_wait_ms, inference_ms, outcome…"""
        if self._log is not None:
            self._log.msg("request", **fields)

    def close(self) -> None:
        """Flush and close the file."""
        if self._file is not None and self._file is not sys.stdout:
            self._file.close()
        self._file = None
        self._log = None
