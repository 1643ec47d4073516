"""LoopBridge: functions scheduled from a foreign thread run as the event loop's own code."""

from __future__ import annotations

import threading

import anyio
import pytest

pytestmark = pytest.mark.anyio


async def test_a_bridged_call_may_use_anyio_when_sniffio_is_installed() -> None:
    # With sniffio importable, anyio finds its backend through a context variable; a call
    # scheduled in the foreign thread's context used to fail with NoEventLoopError.
    pytest.importorskip("sniffio")
    from servo.transport import LoopBridge

    bridge = LoopBridge()
    ran = anyio.Event()
    outcome: list[object] = []

    async with anyio.create_task_group() as tg:

        def on_loop() -> None:
            try:
                event = anyio.Event()  # needs the backend
                tg.start_soon(event.wait)  # needs the backend too
                event.set()
                outcome.append("ok")
            except Exception as exc:
                outcome.append(exc)
            ran.set()

        thread = threading.Thread(target=bridge.call, args=(on_loop,))
        thread.start()
        thread.join()
        with anyio.fail_after(10):
            await ran.wait()
    assert outcome == ["ok"]
