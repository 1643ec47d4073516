"""Process lifecycle shared by the command-line tools: signals and the errors that end a run."""

from __future__ import annotations

import signal
from collections.abc import Callable

import anyio
import structlog

log = structlog.get_logger(__name__)


async def on_signal(action: Callable[[], None]) -> None:
    """Call ``action`` on the first SIGINT/SIGTERM.

    A second signal raises KeyboardInterrupt: the user insisted, teardown is abandoned.
    """
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        first = True
        async for signum in signals:
            if first:
                log.info("signal received, stopping", signal=signal.Signals(signum).name)
                action()
                first = False
            else:
                raise KeyboardInterrupt


def first_error(exc: BaseException) -> BaseException:
    """The single error inside (possibly nested) task-group exception groups, else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
