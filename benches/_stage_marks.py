"""Stamps along one request's way through servo, for `bench_stages.py` (Linux monotonic clock).

`install_client` and `install_server` wrap the functions each stage starts or ends in, so that
every call records ``(mark, time.monotonic_ns())``; the clock is the host's, so the client's and
the server's stamps compare. The server side runs as ``python -m benches._stage_marks EVENTS
<benches._fleet serve arguments>`` and appends its marks to the file EVENTS, one line each.
Nothing in servo knows of them: the stages are servo's own functions, timed from outside.
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # the server's side runs without pytest
    import pytest

#: (mark, monotonic ns) recorded in this process (the client's).
EVENTS: list[tuple[str, int]] = []
_sink: TextIO | None = None


def _mark(name: str) -> None:
    now = time.monotonic_ns()
    if _sink is not None:
        _sink.write(f"{name} {now}\n")
    else:
        EVENTS.append((name, now))


def _wrap(owner: Any, attr: str, before: str | None, after: str | None, patch: Callable[..., None]) -> None:
    original = getattr(owner, attr)
    wrapper: Callable[..., Any]
    if inspect.iscoroutinefunction(original):

        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            if before:
                _mark(before)
            try:
                return await original(*args, **kwargs)
            finally:
                if after:
                    _mark(after)

    else:

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if before:
                _mark(before)
            try:
                return original(*args, **kwargs)
            finally:
                if after:
                    _mark(after)

    patch(owner, attr, functools.wraps(original)(wrapper))


def install_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stamp the client's stages (undone with ``monkeypatch``)."""
    from servo.client import session, uplink

    patch = monkeypatch.setattr
    _wrap(session.RemoteSession, "infer", "infer called", "infer returned", patch)
    _wrap(uplink.Uplink, "_send", "uplink thread", None, patch)
    _wrap(uplink, "encode_into", None, "packed", patch)
    _wrap(session.RemoteSession, "_on_action", "answer on callback thread", None, patch)
    _wrap(session.RemoteSession, "_on_message", "answer on event loop", None, patch)


def install_server(events: str) -> None:
    """Stamp the server's stages into the file ``events`` (for the rest of this process)."""
    global _sink
    from servo.server import decoding, intake, lanes, sessions, worker

    _sink = open(events, "w", buffering=1)  # noqa: SIM115 - written until the process ends

    def patch(owner: Any, attr: str, value: Any) -> None:
        setattr(owner, attr, value)

    _wrap(lanes.IntakeLanes, "__call__", "server callback thread", None, patch)
    _wrap(lanes.IntakeLanes, "_run", "intake lane", None, patch)
    _wrap(intake, "verify_observation", None, "verified", patch)
    _wrap(decoding.ObservationDecoder, "__call__", None, "decoded", patch)
    _wrap(worker.InferenceWorker, "_forward", "worker took it", None, patch)
    _wrap(worker.InferenceWorker, "_reply", "forward done", None, patch)
    _wrap(sessions.Session, "publish", "answer sealed and put", None, patch)


def main(argv: list[str]) -> None:
    install_server(argv[0])
    from benches._fleet import main as fleet

    fleet(["serve", *argv[1:]])


if __name__ == "__main__":
    main(sys.argv[1:])
