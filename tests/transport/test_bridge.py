"""LoopBridge: calls from foreign threads run on the loop, where anyio works."""

from __future__ import annotations

import threading

import anyio
import pytest

from servo.transport import LoopBridge

pytestmark = pytest.mark.anyio


async def test_a_bridged_call_can_use_anyio_from_a_foreign_thread() -> None:
    # With sniffio installed anyio finds its backend through a context variable, which a
    # callback thread's context lacks: the call must run in the bridge creator's.
    bridge = LoopBridge()
    ran = anyio.Event()
    outcome: list[str] = []

    async with anyio.create_task_group() as tg:

        def on_loop() -> None:
            try:
                done = anyio.Event()  # needs the backend
                tg.start_soon(lambda: _set(done, ran))
                outcome.append("ok")
            except Exception as exc:  # reported by the assertion below
                outcome.append(repr(exc))
                ran.set()

        thread = threading.Thread(target=bridge.call, args=(on_loop,))
        thread.start()
        thread.join()
        with anyio.fail_after(10):
            await ran.wait()
    assert outcome == ["ok"]


async def _set(done: anyio.Event, ran: anyio.Event) -> None:
    done.set()
    ran.set()


async def test_a_closed_bridge_drops_calls() -> None:
    bridge = LoopBridge()
    bridge.closed = True
    called: list[int] = []
    bridge.call(called.append, 1)
    # Calls run in order: once a later call on an open bridge ran, the dropped one never will.
    later = anyio.Event()
    LoopBridge().call(later.set)
    with anyio.fail_after(10):
        await later.wait()
    assert called == []
