r"""The terminal of a command-line tool: log lines and one live status line that never collide.

Every byte the tool writes to stderr goes through one `Console`. A log line first erases the
status line (``\r`` + erase-to-end-of-line), is written, and the status line is drawn again
below it; the status line is cut to the terminal's width so it never wraps (a wrapped line
cannot be erased with ``\r`` and would be re-printed as a new line on every refresh).
"""

from __future__ import annotations

import shutil
import sys
import threading
from typing import IO

_ERASE = "\r\x1b[K"


class Console:
    """stderr with a status line. Thread-safe: log lines come from any thread.

    Args:
        stream: Where to write (stderr by default).
        live: Draw the status line at all (only on a terminal: a pipe or a file gets log lines only).
    """

    def __init__(self, stream: IO[str] | None = None, *, live: bool | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self.live = self._stream.isatty() if live is None else live
        self._lock = threading.Lock()
        self._status = ""
        self._pending = ""

    # The file-like half: what logging handlers write.
    def write(self, text: str) -> int:
        """Write log output; whole lines are put above the status line."""
        with self._lock:
            self._pending += text
            if "\n" not in self._pending:
                return len(text)
            lines, _, self._pending = self._pending.rpartition("\n")
            if self.live and self._status:
                self._stream.write(_ERASE)
            self._stream.write(lines + "\n")
            if self.live and self._status:
                self._stream.write(self._status)
            self._stream.flush()
        return len(text)

    def flush(self) -> None:
        """Flush the underlying stream."""
        with self._lock:
            self._stream.flush()

    def isatty(self) -> bool:
        """Whether the underlying stream is a terminal (log renderers colour only then)."""
        return self._stream.isatty()

    # The status half.
    def status(self, text: str) -> None:
        """Replace the status line (cut to the terminal's width). Nothing happens when not live."""
        if not self.live:
            return
        width = shutil.get_terminal_size(fallback=(80, 24)).columns
        line = text if len(text) < width else text[: max(0, width - 2)] + "…"
        with self._lock:
            self._status = line
            self._stream.write(_ERASE + line)
            self._stream.flush()

    def clear_status(self) -> None:
        """Erase the status line for good (before the final summary)."""
        with self._lock:
            if self.live and self._status:
                self._stream.write(_ERASE)
                self._stream.flush()
            self._status = ""

    def say(self, text: str) -> None:
        """One line for a person (progress, the final summary, a one-line error)."""
        self.write(text + "\n")
