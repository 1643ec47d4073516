"""Fakes and helpers shared by the edge tests (injected, never monkeypatched)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from servo.edge.actions import Action
from servo.edge.engine import LOCAL_SESSION, EngineBase
from servo.edge.pipeline import Produced, Request
from servo.robots.builtin import SimOptions, sim_config
from servo.robots.protocol import RobotSpec
from servo.robots.sim import SimSO100

FloatArray = npt.NDArray[np.float32]


class ScriptedActions:
    """An action source whose actions come from a function of the tick index; owned by the loop thread.

    ``on_tick(index)`` runs inside `get_action` (use it to inject a slow tick); ``reached`` is set
    once ``until`` ticks have run.
    """

    def __init__(
        self,
        action: Callable[[int], FloatArray | None],
        *,
        until: int = 0,
        on_tick: Callable[[int], None] | None = None,
    ) -> None:
        self._action = action
        self._until = until
        self._on_tick = on_tick
        self.calls: list[int] = []  # monotonic ns of every get_action
        self.reached = threading.Event()

    def queued(self) -> int:
        return 0

    def position(self) -> int:
        return 0

    def get_action(self, now_ns: int) -> Action | None:
        index = len(self.calls)
        self.calls.append(now_ns)
        if self._on_tick is not None:
            self._on_tick(index)
        if self._until and len(self.calls) >= self._until:
            self.reached.set()
        values = self._action(index)
        return None if values is None else Action(values, "policy", None)


class EchoEngine(EngineBase):
    """The engine loop with the network and the policy cut out: each request is answered at once
    with a one-step chunk holding the observed pose (the arm stays put). Owned by the event loop."""

    async def produce(self, request: Request, *, episode_start: bool) -> Produced:
        self.requests += 1
        chunk = np.asarray(request.obs.state, np.float32)[None, :]
        return Produced(chunk, chunk, LOCAL_SESSION, self.requests, 0.0)


class SpyRobot:
    """Delegates to a SimSO100 and keeps every command sent (control-loop thread)."""

    def __init__(self, sim: SimSO100) -> None:
        self.sim = sim
        self.commands: list[FloatArray] = []

    @property
    def spec(self) -> RobotSpec:
        return self.sim.spec

    def connect(self) -> None:
        self.sim.connect()

    def disconnect(self) -> None:
        self.sim.disconnect()

    def read_state(self) -> FloatArray:
        return self.sim.read_state()

    def send_action(self, target: FloatArray) -> None:
        self.commands.append(np.array(target, copy=True))
        self.sim.send_action(target)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str = "condition") -> None:
    """Blocking `eventually` for sync tests and threads."""
    deadline = time.monotonic() + timeout
    event = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        event.wait(0.005)


class Unplugged(SimSO100):
    """A simulated arm whose bus is not there (its connect fails like a missing serial port)."""

    def connect(self) -> None:
        raise OSError("[Errno 2] could not open port /dev/ttyACM9")


def unplugged(options: SimOptions) -> Unplugged:
    """An arm whose port is missing: a robot plugin (built in the control process, named by path)."""
    return Unplugged(sim_config(options))


class Stuck(SimSO100):
    """A simulated arm whose bus stops answering after the first read (the loop's start): `read_state`
    then never returns (a driver hung in a blocking call), so its loop never sees a stop request."""

    def __init__(self, options: SimOptions) -> None:
        super().__init__(sim_config(options))
        self._reads = 0

    def read_state(self) -> FloatArray:
        self._reads += 1
        if self._reads > 1:
            threading.Event().wait()
        return super().read_state()


def stuck(options: SimOptions) -> Stuck:
    """An arm that hangs at the first tick: a robot plugin (built in the control process, named by path)."""
    return Stuck(options)
