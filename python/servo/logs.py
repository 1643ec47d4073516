"""Logging: servo logs through stdlib `logging` (loggers ``servo.*``) with structlog's bound context.

As a library, servo configures nothing and prints nothing: its loggers hang under ``servo``, which
has a `logging.NullHandler`, so an application decides (``logging.getLogger("servo")
.setLevel(logging.WARNING)`` silences it; ``logging.basicConfig()`` shows it). A record's message is
the structlog event dict (``event`` plus ``session_id`` / ``client_id`` / ``seq_id`` …), so any
stdlib handler sees the context. The command-line tools call `configure_logging`, which renders
those records as console lines or JSON through `structlog.stdlib.ProcessorFormatter`.
"""

from __future__ import annotations

import logging
import sys
from typing import Protocol

import structlog

#: Processors of every servo logger. They run only for records the stdlib level lets through.
_PROCESSORS: list[structlog.typing.Processor] = [
    structlog.stdlib.filter_by_level,
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
]

Logger = structlog.stdlib.BoundLogger


class TextStream(Protocol):
    """Where `configure_logging` writes: a text file or a `servo.cli.console.Console`."""

    def write(self, text: str, /) -> int: ...  # noqa: D102
    def flush(self) -> None: ...  # noqa: D102
    def isatty(self) -> bool: ...  # noqa: D102


logging.getLogger("servo").addHandler(logging.NullHandler())


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
