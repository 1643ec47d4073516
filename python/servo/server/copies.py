"""Copies of a request: answered from its one forward, never with a second.

A client whose answer is overdue sends the same observation again under its next seq_id, flagged
``FLAG_COPY`` (`servo.client.resend`): the answer, or the observation itself, may have been lost.
The server tells which from what it holds of the session. A copy names its original by the
observation's stamp (``client_mono_ns`` and ``episode_id``, the same in both):

* the original still waits, is held by the worker or is in its forward: the copy **joins** it.
  Nothing is decoded and nothing queued; the original keeps its turn, and its answer leaves
  under the copy's seq_id too (a second chance for an answer lost on the way back);
* the original was answered: the copy gets that **answer again**, under its own seq_id (the
  answer was lost on the way back; no forward);
* the server knows no such observation (it was lost on the way up, or dropped by a reset): the
  copy is **served** like any observation.

So a copy costs a forward only when the observation never arrived. Each outcome is counted in
``servo_copies_total{outcome}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from servo._core import Header

#: Copies of one request the server answers, at most (a client sends one; more is a replay).
MAX_COPIES = 4

#: What became of a copy: joined its original, answered from its answer, or served itself.
CopyOutcome = Literal["joined", "answered", "served"]


@dataclass(frozen=True)
class Answer:
    """The latest answer a session's request got: its message type and body, as published."""

    request: Header
    msg_type: int
    body: bytes


def same_observation(a: Header, b: Header) -> bool:
    """Whether two requests carry the same observation (a copy and its original)."""
    return (a.client_mono_ns, a.episode_id) == (b.client_mono_ns, b.episode_id)


@dataclass
class CopyBook:
    """One session's record of the request being served and its latest answer.

    Guarded by the registry lock (`servo.server.sessions.SessionRegistry`): the intake (Zenoh's
    observation thread) asks `join`, the worker reports `dropped`, the reply thread `answered`::

        idle ──deposit(r)──► pending r ──answered(r)──► idle, latest answer = r's
                               │  ▲ join(copy of r): the copy rides along (answered with r)
                               │  └── deposit(s): s replaces r (newest wins); r's copies go
                               └──dropped(r) (reset, closed)──► idle
    """

    pending: Header | None = None
    copies: list[Header] = field(default_factory=list)
    latest: Answer | None = None

    def deposited(self, request: Header) -> None:
        """A request is waiting for the device: copies of an older one are no longer answered."""
        if self.pending is None or not same_observation(self.pending, request):
            self.copies.clear()
        self.pending = request

    def join(self, copy: Header) -> Answer | bool:
        """What answers ``copy``: True when it joined the pending request, else the answer to send again.

        False when the server knows no original (serve the copy).
        """
        if self.pending is not None and same_observation(self.pending, copy):
            if len(self.copies) < MAX_COPIES:
                self.copies.append(copy)
            return True
        if self.latest is not None and same_observation(self.latest.request, copy):
            return self.latest
        return False

    def answered(self, answer: Answer) -> list[Header]:
        """The answer to ``answer.request`` leaves now: the copies to send it to as well."""
        self.latest = answer
        if self.pending is None or not same_observation(self.pending, answer.request):
            return []  # a newer request is pending: its copies wait for its own answer
        copies, self.copies = self.copies, []
        self.pending = None
        return copies

    def dropped(self, request: Header) -> None:
        """A request will never be answered (its episode was reset, or the session closed)."""
        if self.pending is not None and same_observation(self.pending, request):
            self.pending = None
            self.copies.clear()
