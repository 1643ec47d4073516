"""`LoopBridge`: a call from a foreign thread runs on the loop as if a task of it made it."""

from __future__ import annotations

import threading

import anyio
import pytest

from servo.transport import LoopBridge

pytestmark = pytest.mark.anyio


async def test_anyio_works_in_a_bridged_call_even_with_sniffio_installed() -> None:
    """With sniffio importable (trio, httpx bring it), anyio asks it which library runs, and a
    bare ``call_soon_threadsafe`` callback is in no task: starting a task there failed with
    ``NoEventLoopError`` (every session open of the server did)."""
    pytest.importorskip("sniffio")
    bridge = LoopBridge()
    started = anyio.Event()
    outcome: list[BaseException | str] = []

    async def mark() -> None:
        started.set()

    async with anyio.create_task_group() as tg:

        def on_loop() -> None:
            try:
                tg.start_soon(mark)
                outcome.append(anyio.get_cancelled_exc_class().__name__)
            except BaseException as exc:
                outcome.append(exc)

        threading.Thread(target=bridge.call, args=(on_loop,)).start()
        with anyio.fail_after(5):
            await started.wait()
    assert outcome == ["CancelledError"]
