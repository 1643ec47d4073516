"""Exponential backoff between attempts to reach a server, optionally under a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio


class Backoff:
    """Delays of ``initial``, ``initial * factor``, … capped at ``maximum``.

    With ``deadline_s`` the attempts stop once the next wait would end past the deadline
    (counted from construction): `wait` then returns False at once instead of sleeping for
    nothing. Owned by the task that retries.

    Args:
        initial: First delay (s).
        maximum: Ceiling of the delay (s).
        factor: Growth of the delay per attempt.
        deadline_s: Give up this long after construction; never when None.
        clock: Monotonic clock in seconds (injectable for tests).
    """

    def __init__(
        self,
        initial: float,
        maximum: float,
        *,
        factor: float = 2.0,
        deadline_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._initial = initial
        self._maximum = maximum
        self._factor = factor
        self._clock = clock
        self._deadline = None if deadline_s is None else clock() + deadline_s
        self.delay = initial

    def next_delay(self) -> float | None:
        """The delay to wait before the next attempt (and grow the one after); None past the deadline."""
        delay = self.delay
        if self._deadline is not None and self._clock() + delay > self._deadline:
            return None
        self.delay = min(delay * self._factor, self._maximum)
        return delay

    async def wait(self) -> bool:
        """Sleep before the next attempt; False (without sleeping) when the deadline would pass."""
        delay = self.next_delay()
        if delay is None:
            return False
        await anyio.sleep(delay)
        return True

    def reset(self) -> None:
        """Start again from ``initial`` (the link worked)."""
        self.delay = self._initial
