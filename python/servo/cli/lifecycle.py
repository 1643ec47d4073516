"""Process lifecycle shared by the command-line tools: signals, and the errors that end a run."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import NoReturn

import anyio
import zenoh

from servo.errors import first_error as first_error  # where the command-line tools import it from
from servo.logs import get_logger
from servo.transport import zenoh_message

log = get_logger(__name__)

#: Exit status after an interrupt that cut the shutdown short (128 + SIGINT).
INTERRUPTED = 130


async def on_signal(
    stop: Callable[[], None], hurry: Callable[[], None], *, say: Callable[[str], None], what: str
) -> None:
    """Escalating SIGINT/SIGTERM handling: stop gracefully, then hurry, then exit at once.

    1st signal: ``stop()`` (a graceful shutdown: the edge parks the arm, the server drains).
    2nd: ``hurry()`` and one line saying what is still done (the safe part) and what is skipped.
    3rd: one line, then the process exits immediately with status 130.

    Args:
        stop: Begins the graceful shutdown.
        hurry: Skips what is not needed for safety (waiting on the network, draining).
        say: Prints one line for the user.
        what: What the second signal still does, e.g. "parking the arm" (said to the user).
    """
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        count = 0
        async for signum in signals:
            count += 1
            if count == 1:
                log.info("signal received, stopping", signal=signal.Signals(signum).name)
                stop()
            elif count == 2:
                say(f"interrupted again: {what}, skipping the rest; once more exits at once")
                hurry()
            else:
                say("interrupted a third time: exiting now")
                os._exit(INTERRUPTED)


def run_service(
    serve: Callable[[], Awaitable[None]],
    *,
    say: Callable[[str], None],
    known: Mapping[type[BaseException] | tuple[type[BaseException], ...], int],
    debug: bool,
) -> int:
    """Run a long-lived service on asyncio (uvloop) until it stops; its exit status.

    0 when it stopped, 130 after an interrupt; an error of a ``known`` type is said in one line
    and gives its status; anything else gives 1, said in one line, or its traceback with ``debug``.
    """
    try:
        anyio.run(serve, backend="asyncio", backend_options={"use_uvloop": True})
    except KeyboardInterrupt:
        return INTERRUPTED
    except BaseException as group:
        error = first_error(group)
        for kinds, status in known.items():
            if isinstance(error, kinds):
                say(f"error: {zenoh_message(error) if isinstance(error, zenoh.ZError) else error}")
                return status
        if debug:
            raise
        say(f"error: unexpected {type(error).__name__}: {error} (--debug shows the traceback)")
        return 1
    say("stopped")
    return 0


def exit_process(status: int) -> NoReturn:
    """End a command-line tool's process with ``status`` at once: its work is done and closed.

    The interpreter's own teardown is skipped: a process that imported torch spent 2.8 s in its
    final garbage collection and module teardown after its last line (a busy 2-core machine),
    and a servo process is gone within a second of its stop. Logs and stdio are flushed first;
    servo's own threads are daemons that hold nothing to finish (`servo.stages`).
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nobody reads the rest
            stream.flush()
    os._exit(status)
