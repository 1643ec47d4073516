"""From Zenoh callback threads into the event loop, without ever blocking Zenoh.

Zenoh runs every callback entity on its own Python thread fed by a 256-deep queue, or (`direct`)
on its own network thread; a callback that blocks stalls every subscriber of the Zenoh session
(docs/design/zenoh.md §2).
Callbacks therefore only deposit, through `servo.stages.LoopBridge`, which schedules a function
on the loop and returns at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
import zenoh
from zenoh.handlers import Callback

from servo.stages import LoopBridge

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

    Only for rare samples (a query's replies, a matching status): Zenoh's receive task waits for
    the GIL while such a callback runs, and reads nothing meanwhile; a wait longer than the
    peer's lease (a starved process holding the GIL) makes Zenoh close a live link. A stream
    (a session's chunks) and a liveliness token a session lives by get a thread of their own,
    and a server uses none at all: its policy may hold the GIL through a whole forward
    (`servo.server.lanes`).
    """
    return Callback(fn, drop, indirect=False)


async def query(
    zsession: zenoh.Session,
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
    zsession.get(
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
        bridge.close()
        if not done.is_set():
            token.cancel()
    return replies
