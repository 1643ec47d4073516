"""Settling a robot on the fleet without a herd: as many robots move as the imbalance needs.

After a session opens (and, on a streaming edge, whenever a replica appears) a robot looks at the
fleet (`imbalance`). A balanced fleet has every replica within one session of the others, so
``excess = here - ceil(total / replicas)`` sessions must leave the robot's replica while it holds
two or more above the emptiest other one. Every robot of a crowded replica sees the same excess:
each draws whether it is one of those that leave, with the chance ``excess / here``, so as many
draw "leave" as are needed, on average. Robots that look at the same moment see the same fleet,
so a robot that drew "leave" first waits a random time spread over the crowd (`look_window`:
30 ms per session on its replica, between 1 and 15 s), then looks again and moves only if its
replica still holds more than its share (the robots that left meanwhile lowered it), and then
with the chance that the excess left is to the one it drew for: when one more robot is needed,
not every robot still waiting to look again goes for it at once. A robot that moved holds still
for `HOLD_DOWN_S` (`HoldDown`: it never moves back within a second).
Looks go on, each a random time within the same window after the last, until `SETTLED_LOOKS`
in a row found nothing to do (at most `SETTLE_ROUNDS`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from servo.client.discovery import ServerInfo, placement_score
from servo.wire import ServerKeys

#: Looks at the fleet in one settling, at most.
SETTLE_ROUNDS = 24
#: Consecutive balanced looks that end the settling: robots that moved last still look after it.
SETTLED_LOOKS = 3
#: The first look comes a random time up to this after the session opened (s).
FIRST_LOOK_S = 0.25
#: Later looks, and a robot's second look before it moves, spread over this much per session on
#: its replica (s) ...
LOOK_PER_SESSION_S = 0.03
#: ... and over at least / at most this window (s).
LOOK_WINDOW_S = (1.0, 15.0)
#: After a move the robot looks at nothing for this long (s): it never moves back sooner.
HOLD_DOWN_S = 1.0

#: Looks at the fleet: the usable replicas, or None when nobody answered.
Look = Callable[[], Awaitable[list[ServerInfo] | None]]
#: Opens a session on a replica: its keys, or None when it refused.
Move = Callable[[ServerInfo], Awaitable[ServerKeys | None]]


@dataclass(frozen=True)
class Imbalance:
    """What one look at the fleet says of a robot's replica."""

    #: Sessions on the robot's replica, its own included.
    here: int
    #: Sessions that must leave it for the fleet to be balanced (0: it is).
    excess: int
    #: The emptiest other live replica: where a robot that leaves goes.
    target: ServerInfo

    @property
    def chance(self) -> float:
        """The chance that this robot is one of those that leave: as many leave as needed, on average."""
        return self.excess / self.here if self.here else 0.0


def imbalance(mine: ServerKeys, servers: list[ServerInfo]) -> Imbalance | None:
    """The imbalance the robot on replica ``mine`` sees in ``servers``.

    None when its replica, or every other live one, is gone from the view: stop looking.
    """
    here_info = next((s for s in servers if s.keys == mine), None)
    others = [s for s in servers if s is not here_info and not s.status.draining]
    if here_info is None or not others:
        return None
    target = min(others, key=lambda s: (s.status.active_sessions, placement_score(s.status)))
    here = here_info.status.active_sessions
    total = here + sum(s.status.active_sessions for s in others)
    share = math.ceil(total / (len(others) + 1))
    crowded = here - target.status.active_sessions >= 2
    return Imbalance(here, max(0, here - share) if crowded else 0, target)


def look_window(here: int) -> float:
    """How long the next look of a robot whose replica holds ``here`` sessions may come after the last (s)."""
    low, high = LOOK_WINDOW_S
    return min(high, max(low, LOOK_PER_SESSION_S * here))


class HoldDown:
    """When a robot may move again (`HOLD_DOWN_S` after its last move). Owned by its client's event loop."""

    def __init__(self) -> None:
        self.until = -math.inf

    def moved(self) -> None:
        """The robot moved now."""
        self.until = anyio.current_time() + HOLD_DOWN_S

    async def wait(self) -> None:
        """Return once the robot may move again."""
        if (left := self.until - anyio.current_time()) > 0:
            await anyio.sleep(left)


async def settle(
    mine: ServerKeys, look: Look, move: Move, hold: HoldDown, *, once: bool = False, rng: random.Random | None = None
) -> None:
    """Settle the robot on replica ``mine`` (see the module docstring); with ``once``, stop at the first move.

    Args:
        mine: Its replica now.
        look: Looks at the fleet.
        move: Opens a session on a replica; the caller switches to it (and closes the old one).
        hold: The robot's hold-down, shared by every settling of the robot.
        once: Return after the first move (a streaming edge switches between two requests).
        rng: The draws (seeded in tests).
    """
    draw = rng or random.Random()
    balanced = 0
    window = FIRST_LOOK_S
    for _ in range(SETTLE_ROUNDS):
        await anyio.sleep(draw.uniform(0.0, window))
        await hold.wait()
        servers = await look()
        seen = None if servers is None else imbalance(mine, servers)
        if seen is not None:
            window = look_window(seen.here)
        if seen is None or not seen.excess:
            # Nothing to do (a view without its replica or any other counts too: a replica slow
            # to answer its status under load must not end the looks at once).
            balanced += 1
            if balanced >= SETTLED_LOOKS:
                return
            continue
        balanced = 0
        if draw.random() >= seen.chance:
            continue
        await anyio.sleep(draw.uniform(0.0, window))
        servers = await look()
        again = None if servers is None else imbalance(mine, servers)
        if again is None:
            continue
        # As many as needed still leave, on average: fewer the fewer are needed now.
        if draw.random() >= again.chance / seen.chance or anyio.current_time() < hold.until:
            continue
        moved = await move(again.target)
        if moved is None:
            continue
        hold.moved()
        mine = moved
        if once:
            return
