"""Logging: servo logs through stdlib `logging` (loggers ``servo.*``) with structlog's bound context.

As a library, servo configures nothing and prints nothing: its loggers hang under ``servo``, which
has a `logging.NullHandler`, so an application decides (``logging.getLogger("servo")
.setLevel(logging.WARNING)`` silences it; ``logging.basicConfig()`` shows it). A record's message is
the structlog event dict (``event`` plus ``session_id`` / ``client_id`` / ``seq_id`` …), so any
stdlib handler sees the context. The command-line tools call `configure_logging`, which renders
those records as console lines or JSON through `structlog.stdlib.ProcessorFormatter`.

Log hygiene lives here, in one place, because much of what servo logs comes from the network
(client ids, tasks, tags, error texts): every string in a record has its control characters
escaped (a client id cannot move the cursor, clear the terminal or forge a second line) and is
cut to `MAX_FIELD_CHARS`; containers are cut to `MAX_FIELD_ITEMS` items (a 5 MB session-open
never becomes a 5 MB log line). Repeated failures go through a `LogThrottle`: one line per reason
per interval, carrying how many were suppressed.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, MutableMapping
from typing import Any, Protocol

import structlog

#: Longest string kept in a log record (characters); the rest is replaced by a count.
MAX_FIELD_CHARS = 256
#: Most items of a list, tuple or dict kept in a log record.
MAX_FIELD_ITEMS = 16
#: C0/C1 control characters, line and paragraph separators, bidirectional overrides: nothing a
#: name or a message needs, and each can forge, hide or reorder text in a terminal or a log file.
CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_DEPTH = 3


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clean(value: Any, *, depth: int = _DEPTH) -> Any:
    r"""``value`` made safe to log: control characters escaped, strings and containers cut.

    Strings lose their control characters (as ``\xNN`` / ``\uNNNN`` escapes) and keep at most
    `MAX_FIELD_CHARS` characters; bytes are shown as their ``repr`` cut the same way; lists,
    tuples and dicts keep `MAX_FIELD_ITEMS` items (``"…"`` marks the cut), nested up to three
    levels. Anything else is returned as is.
    """
    if isinstance(value, str):
        if len(value) > MAX_FIELD_CHARS:
            value = f"{value[:MAX_FIELD_CHARS]}…(+{len(value) - MAX_FIELD_CHARS} chars)"
        return CONTROL_CHARACTERS.sub(_escape, value)
    if isinstance(value, bytes | bytearray | memoryview):
        return clean(repr(bytes(value[: MAX_FIELD_CHARS + 1])), depth=depth)
    if isinstance(value, Mapping):
        if depth <= 0:
            return f"<{len(value)} items>"
        items = list(value.items())
        out = {clean(str(k), depth=0): clean(v, depth=depth - 1) for k, v in items[:MAX_FIELD_ITEMS]}
        if len(items) > MAX_FIELD_ITEMS:
            out["…"] = f"+{len(items) - MAX_FIELD_ITEMS} items"
        return out
    if isinstance(value, list | tuple | set | frozenset):
        if depth <= 0:
            return f"<{len(value)} items>"
        seq = list(value)
        kept = [clean(v, depth=depth - 1) for v in seq[:MAX_FIELD_ITEMS]]
        if len(seq) > MAX_FIELD_ITEMS:
            kept.append(f"…(+{len(seq) - MAX_FIELD_ITEMS} items)")
        return kept
    return value


def _clean_event(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in event_dict.items():
        if key != "exc_info":
            event_dict[key] = clean(value)
    return event_dict


#: Processors of every servo logger. They run only for records the stdlib level lets through.
_PROCESSORS: list[structlog.typing.Processor] = [
    structlog.stdlib.filter_by_level,
    structlog.contextvars.merge_contextvars,
    _clean_event,
    structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
]

Logger = structlog.stdlib.BoundLogger


class TextStream(Protocol):
    """Where `configure_logging` writes: a text file or a `servo.cli.console.Console`."""

    def write(self, text: str, /) -> int: ...  # noqa: D102
    def flush(self) -> None: ...  # noqa: D102
    def isatty(self) -> bool: ...  # noqa: D102


logging.getLogger("servo").addHandler(logging.NullHandler())
#: What `configure_logging` was last given (level, json): a child process renders the same way.
_configured: list[tuple[str, bool]] = []


def get_logger(name: str) -> Logger:
    """A logger for module ``name`` (``servo.…``): bind context with ``log.bind(session_id=…)``."""
    logger: Logger = structlog.wrap_logger(
        logging.getLogger(name), processors=_PROCESSORS, wrapper_class=structlog.stdlib.BoundLogger
    )
    return logger


def configure_logging(level: str = "info", *, json: bool = False, stream: TextStream | None = None) -> None:
    """Render every log record (servo's and its dependencies') to ``stream``: console or JSON lines.

    For the command-line tools only; a library never calls this.

    Raises:
        ValueError: unknown level name.
    """
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r} (debug, info, warning, error)")
    out = stream if stream is not None else sys.stderr
    last: list[structlog.typing.Processor] = (
        [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
        if json
        else [structlog.dev.ConsoleRenderer(colors=out.isatty(), exception_formatter=structlog.dev.plain_traceback)]
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        processors=[
            structlog.stdlib.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            *last,
        ],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    _configured[:] = [(level, json)]


def logging_flags() -> list[str]:
    """``--log-level`` (and ``--json-logs``) as this process was configured: for a child process of servo's."""
    if not _configured:
        return []
    level, json = _configured[0]
    return ["--log-level", level, *(["--json-logs"] if json else [])]


class LogThrottle:
    """Lets one log line per key through per ``interval_s``, and counts the lines it held back.

    ``allow(key)`` returns None while the key is muted, else the number of lines suppressed
    since the last one let through (log it with the line: ``suppressed=n``). Keys are kept in a
    bounded LRU (`max_keys`), so keys built from network input cannot grow memory. Safe to call
    from any thread (one lock, O(1)).

    Args:
        interval_s: At most one line per key per this many seconds.
        max_keys: Keys remembered; the least recently used is forgotten first.
        clock: Monotonic clock in seconds (injectable for tests).
    """

    def __init__(
        self, interval_s: float = 1.0, *, max_keys: int = 256, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval = interval_s
        self._max_keys = max_keys
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: OrderedDict[Hashable, list[float | int]] = OrderedDict()

    def allow(self, key: Hashable) -> int | None:
        """None when ``key`` logged less than ``interval_s`` ago, else the count suppressed since."""
        now = self._clock()
        with self._lock:
            entry = self._keys.get(key)
            if entry is not None:
                self._keys.move_to_end(key)
                if now - entry[0] < self._interval:
                    entry[1] += 1
                    return None
                suppressed = int(entry[1])
                entry[0], entry[1] = now, 0
                return suppressed
            self._keys[key] = [now, 0]
            if len(self._keys) > self._max_keys:
                self._keys.popitem(last=False)
            return 0
