"""One structured JSON line per served request (seeds/001 §12).

Lines join with edge recordings on (session_id, seq_id).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, Any

import structlog


class AuditLog:
    """Appends JSON lines to a file (or stdout for ``"-"``; disabled for ``""``).

    Written from the inference worker and reply threads (the underlying WriteLogger serialises
    lines under a lock); closed by the event loop once both have stopped.
    """

    def __init__(self, path: str) -> None:
        self._file: IO[str] | None = None
        if not path:
            self._log = None
            return
        self._file = sys.stdout if path == "-" else Path(path).open("a", buffering=1)  # noqa: SIM115
        # An explicit, non-filtering wrapper: the audit trail must not follow the console log
        # level (`--log-level warning` would otherwise drop every line, `msg` being `info`).
        self._log = structlog.wrap_logger(
            structlog.WriteLogger(self._file),
            processors=[
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.JSONRenderer(),
            ],
            wrapper_class=structlog.BoundLogger,
        )

    def write(self, **fields: Any) -> None:
        """Write one line: session_id, client_id, seq_id, episode_id, queue_wait_ms, inference_ms, outcome."""
        if self._log is not None:
            self._log.msg("request", **fields)

    def close(self) -> None:
        """Flush and close the file."""
        if self._file is not None and self._file is not sys.stdout:
            self._file.close()
        self._file = None
        self._log = None
