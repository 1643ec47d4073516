"""The reply stage: answers leave in serving order, on the worker's own thread when nothing waits."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, cast

from servo.server.audit import AuditLog
from servo.server.replies import Reply, ReplyStage
from servo.server.state import ServerState


class Recording(ReplyStage):
    """Records which forward's answers were published, and on which thread; the first one waits."""

    def __init__(self) -> None:
        super().__init__(cast(ServerState, SimpleNamespace(metrics=None)), cast(AuditLog, None))
        self.published: list[tuple[str, str]] = []
        self.accounted: list[tuple[str, str]] = []
        self.release = threading.Event()
        self.done = threading.Event()
        self.settled = threading.Event()

    def _answer_all(self, replies: list[Reply]) -> list[Callable[[], None]]:
        (name,) = cast(list[Any], replies)
        if name == "stuck":
            assert self.release.wait(30)
        self.published.append((name, threading.current_thread().name))
        if name == "last":
            self.done.set()
        return [lambda: self.accounted.append((name, threading.current_thread().name))]

    def _settled(self, done: Future[None], replies: list[Reply]) -> None:
        super()._settled(done, replies)
        if cast(list[Any], replies) == ["last"]:
            self.settled.set()


def forward(name: str) -> list[Reply]:
    return cast(list[Reply], [name])


def test_with_nothing_waiting_the_caller_answers_itself() -> None:
    stage = Recording()
    stage.submit(forward("a"), here=True)
    assert stage.published == [("a", threading.current_thread().name)]
    stage.submit(forward("b"))  # work waits for the device: the reply thread answers
    stage.submit(forward("last"), here=True)
    assert stage.done.wait(30)
    assert [name for name, _ in stage.published] == ["a", "b", "last"]
    assert stage.published[1][1] == "servo-reply"
    assert stage.close(timeout=30)  # what is queued runs first
    # Every answer accounted for, in serving order, on the reply thread (the audit line is a write).
    assert stage.accounted == [("a", "servo-reply"), ("b", "servo-reply"), ("last", "servo-reply")]


def test_answers_still_on_their_way_keep_the_next_ones_behind_them() -> None:
    stage = Recording()
    stage.submit(forward("stuck"))  # a put blocked on a link, on the reply thread
    stage.submit(forward("last"), here=True)  # would overtake it if answered here
    assert stage.published == []
    stage.release.set()
    assert stage.settled.wait(30)
    assert stage.published == [("stuck", "servo-reply"), ("last", "servo-reply")]
    stage.submit(forward("after"), here=True)  # all settled: the caller again
    assert stage.published[-1] == ("after", threading.current_thread().name)
    assert stage.close(timeout=5)
