"""From Zenoh callback threads into the event loop, without ever blocking Zenoh.

Zenoh runs every callback entity on its own Python thread fed by a 256-deep queue; a callback
that blocks stalls every subscriber of the session (docs/design/zenoh.md §2). Callbacks therefore only
deposit: `LoopBridge.call` schedules a function on the loop with ``call_soon_threadsafe`` and
returns at once. (anyio's ``from_thread.run_sync`` would block the callback thread until the loop
ran the function, and measured slower.) servo runs anyio on the asyncio backend (uvloop when
available), which is what makes the asyncio primitive available.

A function scheduled this way runs in the context of the task that made the bridge, as anyio's
own thread-to-loop calls do: with ``sniffio`` installed, anyio finds its backend through a
context variable that `anyio.run` sets, and a callback running in the Zenoh thread's context
would fail every anyio call (``NoEventLoopError`` on ``TaskGroup.start_soon``, ``anyio.Event()``).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import zenoh
from zenoh.handlers import Callback

#: How long after its own timeout a query waits for Zenoh's drop callback (s).
DROP_GRACE_S = 2.0

T = TypeVar("T")


def direct(fn: Callable[[T], None], drop: Callable[[], None] | None = None) -> Callback[T]:
    """A Zenoh callback run on Zenoh's own thread, for callbacks that only deposit (never block).

    By default zenoh-python starts a Python thread for every callback entity and every callback
    ``get``, synchronously, on the caller's thread: a client that fails over declares about six
    of them, and at load each start held the event loop ~10 ms (a 50-robot process stalled for
    most of a second after a replica died). A function that only schedules work on the loop
    (`LoopBridge.call`) or copies a bounded sample needs no thread of its own.
    """
    return Callback(fn, drop, indirect=False)


class LoopBridge:
    """Schedules calls on the event loop that created it; safe to use from any thread.

    Created on the event-loop thread; `call` is used from Zenoh callback threads.
    """

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._context = contextvars.copy_context()
        self.closed = False

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop soon; dropped silently once the bridge is closed."""
        if self.closed:
            return
        try:
            # A copy per call, as asyncio gives every task: what one call sets stays its own.
            self._loop.call_soon_threadsafe(fn, *args, context=self._context.copy())
        except RuntimeError:
            # Zenoh keeps draining queued callbacks after session.close(); the loop may be gone.
            self.closed = True


async def query(
    session: zenoh.Session,
    selector: str,
    *,
    payload: bytes | None = None,
    attachment: bytes | None = None,
    timeout: float,
    target: zenoh.QueryTarget = zenoh.QueryTarget.ALL,
) -> list[zenoh.Reply]:
    """Send a query and collect every reply without blocking the loop.

    Consolidation is always off: replicas answering on the same key would otherwise be merged
    into one reply (docs/design/zenoh.md §3). Ends when every queryable has answered or ``timeout`` (s)
    elapsed; a cancelled caller cancels the query. Never raises a timeout of its own: the replies
    gathered by then are the answer, as when Zenoh's timeout ends the query, so callers see the
    errors they already handle (no reply, or no genuine one).
    """
    bridge = LoopBridge()
    replies: list[zenoh.Reply] = []
    done = anyio.Event()
    token = zenoh.CancellationToken()
    handler: Callback[zenoh.Reply] = direct(
        lambda reply: bridge.call(replies.append, reply), lambda: bridge.call(done.set)
    )
    session.get(
        selector,
        handler,
        target=target,
        consolidation=zenoh.ConsolidationMode.NONE,
        timeout=timeout,
        payload=payload,
        attachment=attachment,
        cancellation_token=token,
    )
    try:
        # Zenoh's own timeout ends the query; the grace only guards against a lost or late drop
        # (a callback thread starved for seconds under load). Raising then (the builtin
        # TimeoutError) discarded the replies and escaped every connect_best caller.
        with anyio.move_on_after(timeout + DROP_GRACE_S):
            await done.wait()
    finally:
        bridge.closed = True
        if not done.is_set():
            token.cancel()
    return replies
