"""What ``servo-edge`` and ``servo-serve`` tell systemd when a ``Type=notify`` unit runs them.

* ``servo-edge``: ``READY=1`` the first time the engine streams (chunks arrive and the arm moves
  on the policy); ``WATCHDOG=1`` only while the control loop ticks: each ping needs ticks counted
  since the previous one, no latched fault and the loop running. A control process that hangs,
  dies or faults stops the pings, and systemd (``WatchdogSec=``, ``Restart=``) restarts the edge;
  the ticks are read from the loop's shared block by the event loop, so a stuck event loop stops
  them too. ``STATUS=`` carries the engine's state.
* ``servo-serve``: ``READY=1`` once warmed and serving; ``WATCHDOG=1`` while the inference worker
  turns (its loop comes round at least every 0.25 s when idle, after each forward when busy).

Both send ``STOPPING=1`` when the first SIGINT/SIGTERM begins the graceful stop (`stopping`):
the edge parks the arm, the server drains. Each report runs as one task on the process's event
loop; see `servo.systemd` for the protocol.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from servo.systemd import Notifier

if TYPE_CHECKING:
    from servo.edge.runtime import EdgeRuntime
    from servo.server.service import PolicyServer, ServerReady

#: How often the state is looked at (READY promptness, STATUS updates) when no watchdog asks for more.
POLL_S = 0.5


class _Watchdog:
    """``WATCHDOG=1`` at the watchdog's interval, each only if the watched count advanced since.

    Owned by the reporting task.
    """

    def __init__(self, notifier: Notifier) -> None:
        self.interval = notifier.ping_interval_s
        self._last = time.monotonic()
        self._count: int | None = None

    def ping(self, count: Callable[[], int | None]) -> bool:
        """Whether to ping now; ``count``: the work done so far, None when not working."""
        if self.interval is None or time.monotonic() - self._last < self.interval:
            return False
        self._last = time.monotonic()
        now, before = count(), self._count
        self._count = now
        return now is not None and (before is None or now > before)

    @property
    def period_s(self) -> float:
        """How long the reporting task sleeps between looks."""
        return POLL_S if self.interval is None else min(POLL_S, self.interval)


async def notify_edge(notifier: Notifier, runtime: EdgeRuntime) -> None:
    """Report ``runtime`` to systemd until cancelled (see the module docstring)."""
    from servo.edge.failsafe import EngineState

    def ticks() -> int | None:
        loop = runtime.loop
        if loop is None or not loop.running or loop.fault:
            return None
        return loop.statistics().ticks

    watchdog = _Watchdog(notifier)
    ready, status = False, ""
    while True:
        state = runtime.engine.state
        lines = []
        if not ready and state is EngineState.STREAMING:
            ready = True
            lines.append("READY=1")
        if watchdog.ping(ticks):
            lines.append("WATCHDOG=1")
        if f"STATUS={state.value}" != status:
            status = f"STATUS={state.value}"
            lines.append(status)
        if lines:
            notifier.send(*lines)
        await anyio.sleep(watchdog.period_s)


async def notify_server(notifier: Notifier, server: PolicyServer, ready: ServerReady) -> None:
    """Report a server that has just become ready to systemd until cancelled."""
    notifier.send("READY=1", f"STATUS=serving {ready.keys.prefix}")
    watchdog = _Watchdog(notifier)
    while True:
        if watchdog.ping(lambda: server.worker_turns):
            notifier.send("WATCHDOG=1")
        await anyio.sleep(watchdog.period_s)


def stopping(notifier: Notifier | None, stop: Callable[[], None]) -> Callable[[], None]:
    """``stop``, telling systemd first (``STOPPING=1``) when a notifier is given."""
    if notifier is None:
        return stop

    def stop_and_say() -> None:
        notifier.send("STOPPING=1")
        stop()

    return stop_and_say
