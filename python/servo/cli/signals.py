"""SIGINT/SIGTERM handling for the command-line tools."""

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
