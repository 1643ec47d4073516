"""Hand-offs between threads: one small vocabulary, one close rule.

Every hand-off between two threads in servo takes one of four shapes:

* `NewestSlot` — one value, the newest wins: a reader only ever wants the latest (a camera's frame,
  the job of an encoder whose older request was abandoned);
* `BoundedFifo` — order kept, bounded: a full FIFO refuses at once (counted), it never blocks the
  thread that puts;
* `StageThread` — one owner thread and its job queue (a FIFO, or a newest-wins slot); every job
  submitted gets a `concurrent.futures.Future`;
* `LoopBridge` — any thread into the event loop (deposit only: the caller never waits).

The close rule, the same for all four (the contract of `concurrent.futures`'
``shutdown(cancel_futures=True)``, made the only one): a closed hand-off refuses what comes after,
wakes everyone waiting on it, and settles what it held — every pending job's future fails with
`StageClosed` (a job replaced by a newer one fails with `Superseded`), so no thread is ever left
waiting for something that will never come. Every owner thread is a daemon, named ``servo-…``
(also at the OS level, for ``top -H`` and ``/proc``): no thread of servo can keep the interpreter
from exiting. At exit, the stages still open are closed (their pending jobs settled, their long
jobs told by ``closing``) and joined for at most `EXIT_GRACE_S` in all, before Python joins its
non-daemon threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ctypes
import ctypes.util
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from servo.errors import ServoError

T = TypeVar("T")
R = TypeVar("R")

#: At interpreter exit, how long all open stages together may take to end their jobs (s).
EXIT_GRACE_S = 0.2
#: Jobs a FIFO stage holds beyond the one running, unless told otherwise.
DEFAULT_CAPACITY = 64


class NotRun(ServoError, RuntimeError):
    """A job that never ran: its stage closed first, or a newer job took its place."""


class StageClosed(NotRun):
    """The hand-off was closed before this item or job was taken."""


class Superseded(NotRun):
    """A newer job took this one's place in a newest-wins stage before it started."""


class StageFull(NotRun):
    """The stage's FIFO was full: the job was refused at once."""


class NewestSlot(Generic[T]):
    """One value, the newest: a writer never waits, a reader takes the newest or waits for one.

    Any thread may `put`; `peek`, `take` never wait; `get` and `wait_newer` block under a
    deadline. ``version`` counts the values put so far (a reader says which one it saw)::

        empty ──put──► full ──take / get──► empty
                        │ ▲
                        └─┘ put: the newer wins (the displaced value goes back to the writer)
        any ──close──► closed: put raises StageClosed; get returns what is there, then raises
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._value: T | None = None
        self._version = 0
        self._closed = False

    @property
    def version(self) -> int:
        """How many values were put so far."""
        return self._version

    def put(self, value: T) -> T | None:
        """Make ``value`` the newest; returns the value it displaced (never taken), if any.

        Raises:
            StageClosed: the slot is closed.
        """
        with self._cond:
            if self._closed:
                raise StageClosed("the slot is closed")
            displaced, self._value = self._value, value
            self._version += 1
            self._cond.notify_all()
            return displaced

    def peek(self) -> T | None:
        """The newest value (left in place), or None; never waits."""
        return self._value

    def take(self) -> T | None:
        """Take the newest value, or None when empty; never waits."""
        with self._cond:
            value, self._value = self._value, None
            return value

    def get(self, timeout: float | None = None) -> T | None:
        """Take the newest value, waiting up to ``timeout`` s (None: no limit) for one; None on timeout.

        Raises:
            StageClosed: closed and empty.
        """
        with self._cond:
            self._cond.wait_for(lambda: self._value is not None or self._closed, timeout)
            value, self._value = self._value, None
            if value is None and self._closed:
                raise StageClosed("the slot is closed")
            return value

    def wait_newer(self, seen: int, timeout: float) -> T | None:
        """The newest value once ``version`` passed ``seen`` (left in place); None after ``timeout`` s or a close."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._version > seen or self._closed, timeout):
                return None
            return self._value if self._version > seen else None

    def close(self, *, keep: bool = False) -> list[T]:
        """Refuse later puts and wake every waiter; returns the value still held (taken out), if any.

        With ``keep`` the value stays for a reader to take (nothing is returned).
        """
        with self._cond:
            self._closed = True
            value = None
            if not keep:
                value, self._value = self._value, None
            self._cond.notify_all()
            return [] if value is None else [value]


class BoundedFifo(Generic[T]):
    """First in, first out, at most ``capacity`` items: a full FIFO refuses, it never blocks the writer.

    Any thread may `put`; readers `get` in order (blocking under a deadline). Refusals are
    counted in ``refused``::

        open ──put (room)──► holds n+1 ──get──► holds n
          │ └─put (full)──► refused += 1, put returns False
          └──close──► closed: put raises StageClosed; get drains what is there, then raises
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.refused = 0
        self._cond = threading.Condition()
        self._items: deque[T] = deque()
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T) -> bool:
        """Append ``item``; False (and counted) when the FIFO is full.

        Raises:
            StageClosed: the FIFO is closed.
        """
        with self._cond:
            if self._closed:
                raise StageClosed("the FIFO is closed")
            if len(self._items) >= self.capacity:
                self.refused += 1
                return False
            self._items.append(item)
            self._cond.notify()
            return True

    def get(self, timeout: float | None = None) -> T | None:
        """The oldest item, waiting up to ``timeout`` s (None: no limit) for one; None on timeout.

        Raises:
            StageClosed: closed and empty.
        """
        with self._cond:
            self._cond.wait_for(lambda: bool(self._items) or self._closed, timeout)
            if self._items:
                return self._items.popleft()
            if self._closed:
                raise StageClosed("the FIFO is closed")
            return None

    def close(self, *, keep: bool = False) -> list[T]:
        """Refuse later puts and wake every reader; returns the items taken out (all, unless ``keep``).

        With ``keep`` the items stay for readers to drain (nothing is returned).
        """
        with self._cond:
            self._closed = True
            items = [] if keep else list(self._items)
            if not keep:
                self._items.clear()
            self._cond.notify_all()
            return items


@dataclass(frozen=True)
class _Job(Generic[R]):
    future: Future[R]
    fn: Callable[..., R]
    args: tuple[Any, ...]


def settle(future: Future[Any], error: BaseException) -> None:
    """Fail ``future`` with ``error`` unless it is already settled (done, or cancelled by its owner)."""
    with contextlib.suppress(RuntimeError):  # InvalidStateError: a cancelled or finished future
        if future.set_running_or_notify_cancel():
            future.set_exception(error)


class StageThread:
    """One owner thread running the jobs submitted to it, in order (or only the newest).

    Any thread may `submit`; the owner thread (a daemon named ``name``) runs each job and settles
    its future with the result or the exception. With ``newest_wins`` the stage holds one
    pending job: a newer one takes its place and the older one fails with `Superseded`;
    otherwise a FIFO of ``capacity`` pending jobs (a job beyond it fails with `StageFull`). A job
    that runs long (a loop) watches ``closing``::

        open ──submit──► pending ──owner thread──► running ──► settled: result / exception
                            │                         │
                            │ close()                 │ close(): finishes; ``closing`` is set
                            ▼                         ▼
                         settled: StageClosed      settled by the job itself
        close(finish=True): pending jobs still run, later submits fail with StageClosed.
    """

    def __init__(self, name: str, *, newest_wins: bool = False, capacity: int = DEFAULT_CAPACITY) -> None:
        self.name = name
        #: Set by `close`: a long job (a loop) ends when it sees it.
        self.closing = threading.Event()
        self._inbox: NewestSlot[_Job[Any]] | BoundedFifo[_Job[Any]] = (
            NewestSlot() if newest_wins else BoundedFifo(capacity)
        )
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _register(self)

    @property
    def alive(self) -> bool:
        """Whether the owner thread still runs."""
        return self._thread.is_alive()

    def submit(self, fn: Callable[..., R], *args: Any) -> Future[R]:
        """Queue ``fn(*args)``; its future settles with what it returns or raises, or why it never ran."""
        future: Future[R] = Future()
        job = _Job(future, fn, args)
        try:
            if isinstance(self._inbox, NewestSlot):
                if (displaced := self._inbox.put(job)) is not None:
                    settle(displaced.future, Superseded(f"{self.name}: a newer job took this one's place"))
            elif not self._inbox.put(job):
                settle(future, StageFull(f"{self.name}: {self._inbox.capacity} jobs already wait"))
        except StageClosed:
            settle(future, StageClosed(f"{self.name} is closed"))
        return future

    def close(self, *, finish: bool = False, timeout: float = 0.0) -> bool:
        """Stop taking jobs (idempotent); returns whether the owner thread ended within ``timeout`` s.

        Every pending job fails with `StageClosed`, unless ``finish``: then they still run, in
        order. The running job is never interrupted (a long one sees ``closing``). Called on the
        owner thread itself (by a job), it never waits.
        """
        self.closing.set()
        for job in self._inbox.close(keep=finish):
            settle(job.future, StageClosed(f"{self.name} closed before this job started"))
        return self.join(timeout)

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the owner thread to end; whether it has."""
        if timeout > 0 and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        _name_os_thread(self.name)
        while True:
            try:
                job = self._inbox.get()
            except StageClosed:
                return
            if job is None or not job.future.set_running_or_notify_cancel():
                continue  # cancelled by its owner before it started: settled already
            try:
                result = job.fn(*job.args)
            except BaseException as exc:  # handed to whoever waits on the future
                job.future.set_exception(exc)
            else:
                job.future.set_result(result)
                del result
            del job  # a finished job's arguments (frames, replies) are not held until the next one


class LoopBridge:
    """Schedules calls on the event loop that created it; safe to use from any thread.

    Created on the event-loop thread; `call` is used from other threads (Zenoh callbacks, stage
    threads) and only deposits: ``call_soon_threadsafe``, the caller never waits. (anyio's
    ``from_thread.run_sync`` would block the calling thread until the loop ran the function.) servo
    runs anyio on the asyncio backend (uvloop when available), which makes the asyncio primitive
    available. A function scheduled this way runs in the context of the task that made the bridge,
    as anyio's own thread-to-loop calls do: with ``sniffio`` installed, anyio finds its backend
    through a context variable that `anyio.run` sets, and a function running in a foreign thread's
    context would fail every anyio call (``NoEventLoopError``)::

        open ──call──► scheduled on the loop (a copy of the creator's context per call)
          └──close / the loop is gone──► closed: later calls are dropped (nobody is left to run them)
    """

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._context = contextvars.copy_context()
        self.closed = False

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop soon; dropped once the bridge is closed."""
        if self.closed:
            return
        try:
            # A copy per call, as asyncio gives every task: what one call sets stays its own.
            self._loop.call_soon_threadsafe(fn, *args, context=self._context.copy())
        except RuntimeError:
            # Zenoh keeps draining queued callbacks after session.close(); the loop may be gone.
            self.closed = True

    def close(self) -> None:
        """Drop every later call (the loop's owner is done with this bridge)."""
        self.closed = True


# --------------------------------------------------------------------------- exit and OS names
_live: weakref.WeakSet[StageThread] = weakref.WeakSet()
_live_lock = threading.Lock()
_exit_hook = False
_PR_SET_NAME = 15
_libc = ctypes.CDLL(ctypes.util.find_library("c")) if sys.platform == "linux" else None


def _register(stage: StageThread) -> None:
    global _exit_hook
    with _live_lock:
        _live.add(stage)
        if not _exit_hook:
            # Runs before the interpreter joins non-daemon threads (concurrent.futures uses it too).
            register: Callable[[Callable[[], None]], None] | None = getattr(threading, "_register_atexit", None)
            if register is not None:
                register(_close_all)
            _exit_hook = True


def _close_all() -> None:
    """At exit: close every open stage, then give their threads `EXIT_GRACE_S` in all to end."""
    with _live_lock:
        stages = list(_live)
    for stage in stages:
        stage.close()
    deadline = time.monotonic() + EXIT_GRACE_S
    for stage in stages:
        stage.join(max(0.0, deadline - time.monotonic()))


def _name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` at the OS level too (Linux: 15 bytes), for ``top -H`` and /proc."""
    if _libc is not None:
        _libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
