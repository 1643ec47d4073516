"""Which ready sessions the inference worker serves next.

The seam exists so micro-batching across sessions can land later without touching the worker:
a batching scheduler returns several same-shape sessions at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

S = TypeVar("S")


class Scheduler(Protocol):
    """Picks sessions to serve from those with a pending observation.

    Called by the inference worker thread only.
    """

    def select(self, ready: Sequence[S]) -> Sequence[S]:
        """``ready`` is in ring order, starting after the session served last."""
        ...


class RoundRobin:
    """One session per step, in ring order.

    Every ready session gets one inference per cycle, so no client can starve another however
    fast it sends.
    """

    def select(self, ready: Sequence[S]) -> Sequence[S]:
        """The first ready session after the one served last."""
        return ready[:1]
