"""The server's side of its policy process: the forwards of `InferenceRunner`, run in a child.

With ``model.process = "separate"`` (the default) ``servo-serve`` never imports torch: the
process robots connect to holds the network, the sessions and every check, and a child
(`servo.policy.host`) holds the policy and its device. Killed, the server is gone at once and its
robots move to another replica, instead of waiting for the kernel to unmap torch and a CUDA
context before the sockets close (``benches/results/failover.md``: 2.2 s beside 16 busy loops).

`PolicyProcess` stands where an `InferenceRunner` stands: the inference worker's thread calls
`infer_batch` (one round trip over the link: the observations out, the chunks back); the
processors of sessions are numbers here and objects in the child, made on first use and
dropped with their session. Episode resets ride on the next forward, which is the first that
could see them.

If the child exits, the server cannot serve: it logs why and exits at once with status 70, so
its robots fail over and a supervisor starts it again, as it would after a crash of the server.
"""

from __future__ import annotations

import itertools
import os
import site
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import NoReturn

import anyio

from servo.errors import PolicyError
from servo.logs import get_logger, logging_flags
from servo.policy import channel
from servo.policy.channel import Body, Channel, ChannelClosed, Failure
from servo.policy.errors import PolicyLoadError, PolicyOutputError
from servo.policy.loader import load_policy
from servo.policy.protocol import DecodedObservation, FloatArray, Policy, PolicySpec, Prepared
from servo.policy.runner import InferenceRunner, Outcome, Request
from servo.server.manifest import ModelSection
from servo.stages import StageThread

log = get_logger(__name__)

#: The status a server exits with when its policy process is gone (EX_SOFTWARE).
POLICY_LOST_STATUS = 70
#: How long a closed link gives the child to exit before it is killed (and left to the kernel).
_EXIT_WAIT_S = 1.0


class RemoteProcessor:
    """A session's processor, living in the policy process under ``key``.

    Owned by the inference worker's thread (`reset`); its end is noticed from any thread.
    """

    def __init__(self, owner: PolicyProcess, key: int) -> None:
        self.key = key
        self._owner = owner
        weakref.finalize(self, owner.dropped.append, key)

    def preprocess(self, obs: DecodedObservation) -> Prepared:
        """Not here: the policy process preprocesses (`PolicyProcess.infer_batch` sends the observation)."""
        raise TypeError("a remote processor runs in the policy process: serve it with PolicyProcess.infer_batch")

    def postprocess(self, chunk: FloatArray) -> FloatArray:
        """Not here: the policy process postprocesses."""
        raise TypeError("a remote processor runs in the policy process: serve it with PolicyProcess.infer_batch")

    def reset(self) -> None:
        """Reset before this session's next forward."""
        self._owner.resets.append(self.key)


class PolicyProcess:
    """A policy served by a child process. `spawn` on a long-lived thread, then `load` anywhere.

    After `load`, owned by the inference worker's thread (`infer_batch`, `reset_policy`); any
    thread may make processors. ``spawn`` must run on a thread that outlives the child (the event
    loop's): Linux kills the child when the thread that started it ends.
    """

    def __init__(self, proc: subprocess.Popen[bytes], channel: Channel) -> None:
        self._proc = proc
        self._channel = channel
        self._keys = itertools.count(1)
        self._spec: PolicySpec | None = None
        self.batching = False
        #: Processor keys to reset or drop, sent with the next forward (appended from any thread).
        self.resets: list[int] = []
        self.dropped: list[int] = []
        self._reset_policy = False
        self._closed = threading.Event()
        #: Started once the policy is loaded (a child dying before that is a start error of `load`).
        self._watch: StageThread | None = None

    @classmethod
    def spawn(cls) -> PolicyProcess:
        """Start the child (it waits for `load`)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # systemd's notify socket and watchdog are the server's: the policy process is not the service.
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
        # The child imports this very servo: from a checkout put on sys.path by hand too (an
        # installed one it finds by itself). The policy's own module comes with `load`.
        package_dir = str(Path(__file__).resolve().parents[2])
        if package_dir not in {*site.getsitepackages(), site.getusersitepackages()}:
            env["PYTHONPATH"] = os.pathsep.join([package_dir, *filter(None, [env.get("PYTHONPATH")])])
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "servo.policy.host", str(theirs.fileno()), *logging_flags()],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            theirs.close()
        return cls(proc, Channel(ours, arena="writes"))

    @property
    def pid(self) -> int:
        """The policy process's pid."""
        return self._proc.pid

    @property
    def spec(self) -> PolicySpec:
        """The policy's spec, as the policy process loaded it."""
        assert self._spec is not None, "load() first"
        return self._spec

    def load(self, model: ModelSection, search_path: str | Path | None = None) -> PolicySpec:
        """Load the manifest's policy in the child (blocking: run it off the event loop).

        Raises:
            PolicyLoadError: what the child said, in one line, or that it exited.
            PolicyProcessError: an unexpected exception in the child (its class named as the original).
        """
        where = None if search_path is None else str(Path(search_path).resolve())
        load = channel.Load(
            model.source, model.options, model.device, model.dtype, model.compile, model.cuda_graphs, where
        )
        reply = self._ask(load)
        assert isinstance(reply, channel.Loaded)
        self._spec, self.batching = reply.spec, reply.batching
        # From now on a child that dies ends the server, also while no forward is asked of it.
        self._watch = StageThread("servo-policy-watch")
        self._watch.submit(self._watch_child)
        return reply.spec

    def warmup(self, count: int, batch_sizes: Sequence[int] = ()) -> list[float]:
        """`InferenceRunner.warmup`, in the child."""
        reply = self._ask(channel.Warmup(count, list(batch_sizes)))
        assert isinstance(reply, channel.Durations)
        return reply.seconds

    def timed_forwards(self, count: int) -> list[float]:
        """`InferenceRunner.timed_forwards`, in the child."""
        reply = self._ask(channel.Timed(count))
        assert isinstance(reply, channel.Durations)
        return reply.seconds

    def make_processor(self) -> RemoteProcessor:
        """A new session's processor (made in the child at its first forward)."""
        return RemoteProcessor(self, next(self._keys))

    def reset_policy(self) -> None:
        """Reset the policy's episode state before the next forward (exclusive serving)."""
        self._reset_policy = True

    def infer_batch(self, requests: Sequence[Request]) -> list[Outcome]:
        """`InferenceRunner.infer_batch`, in the child: each request gets its chunks or its error.

        A lost child ends the server (`POLICY_LOST_STATUS`): nothing here can serve any more.

        Raises:
            ChannelClosed: `close` ran before the answer came (a forward abandoned at stop).
        """
        body = Body()
        wire = []
        for processor, obs, delay in requests:
            assert isinstance(processor, RemoteProcessor), "processors of this server come from make_processor()"
            wire.append(body.observation(processor.key, obs, delay))
        message = channel.Infer(wire, _take(self.resets), _take(self.dropped), self._reset_policy)
        self._reset_policy = False
        try:
            self._channel.send(message, body)
            reply, arrays = self._channel.receive()
        except ChannelClosed as exc:
            if self._closed.is_set():  # the server stopped without waiting for this forward
                raise
            self._lost(exc)
        if not isinstance(reply, channel.Outcomes) or len(reply.outcomes) != len(wire):
            self._lost(ChannelClosed(f"the policy process answered a forward with {type(reply).__name__}"))
        return [
            _exception(o) if isinstance(o, Failure) else (arrays.take(o.model), arrays.take(o.robot))
            for o in reply.outcomes
        ]

    def close(self, timeout: float = _EXIT_WAIT_S) -> None:
        """End the link: the child finishes its forward in flight, closes its end and exits.

        Waits for that close (at most ``timeout`` s, then the child is killed), never for the
        kernel to tear the child down: beside busy loops unmapping torch takes longer than a
        server's stop may, and the child has nothing left to do by then.
        """
        if self._closed.is_set():
            return
        self._closed.set()
        if self._watch is not None:
            self._watch.close()  # it ends once the child is reaped
        if not self._channel.finish(timeout):
            self._proc.kill()
        self._channel.close()
        if self._watch is None:  # it never served (a failed start): nobody else reaps it
            self._ended(timeout)

    def _ended(self, timeout: float) -> int | None:
        """The child's exit status within ``timeout`` s; past it, it is killed (not waited for) and None."""
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            return None

    def _watch_child(self) -> None:
        # Also reaps the child after `close`: its thread ends once the kernel has torn the child down.
        status = self._proc.wait()
        if not self._closed.is_set():
            self._lost(ChannelClosed(f"it exited with status {status}"))

    def _ask(self, message: channel.Message) -> channel.Message:
        try:
            self._channel.send(message)
            reply, _ = self._channel.receive()
        except ChannelClosed as exc:  # it exited, or (a bug) broke the link: it ends either way
            status = self._ended(_EXIT_WAIT_S)
            raise PolicyLoadError(f"the policy process ended (status {status}) before answering: {exc}") from None
        if isinstance(reply, channel.Failed):
            raise _exception(reply.failure)  # a bug stays a bug: the command line says so, as it would inline
        return reply

    def _lost(self, exc: ChannelClosed) -> NoReturn:
        status = self._proc.poll()
        log.critical(
            "policy process lost: the server exits so its robots move to another replica", status=status, error=str(exc)
        )
        sys.stderr.flush()
        os._exit(POLICY_LOST_STATUS)


def _take(keys: list[int]) -> list[int]:
    """Empty ``keys`` and return what it held; ``pop`` is atomic, so another thread may append meanwhile."""
    taken = []
    while keys:
        taken.append(keys.pop())
    return taken


#: Exception classes for the kinds a policy process reported, so a client reads the same error.
_KINDS: dict[str, type[Exception]] = {"PolicyOutputError": PolicyOutputError, "PolicyLoadError": PolicyLoadError}


class PolicyProcessError(PolicyError):
    """An exception raised in the policy process (its class is named after the original's)."""


def _exception(failure: Failure) -> Exception:
    if failure.kind == "ModuleNotFoundError":
        return ModuleNotFoundError(failure.message, name=failure.missing)
    kind = _KINDS.get(failure.kind)
    if kind is None:
        kind = _KINDS[failure.kind] = type(failure.kind, (PolicyProcessError,), {})
    return kind(failure.message)


@asynccontextmanager
async def forwards_for(
    model: ModelSection, policy: Policy | None = None, search_path: str | Path | None = None
) -> AsyncIterator[InferenceRunner | PolicyProcess]:
    """The manifest's policy, loaded where ``model.process`` says (a ``policy`` given: in this process).

    The policy process is started on the calling (event loop's) thread, which outlives it (see
    `PolicyProcess`), and closed when the block ends, after the server's last forward.
    """
    inline = policy is not None or model.process == "inline"
    log.info("loading policy", source=model.source, device=model.device, process="inline" if inline else "separate")
    if inline:
        if policy is None:
            policy = await anyio.to_thread.run_sync(
                lambda: load_policy(model.source, model.options, device=model.device, search_path=search_path)
            )
        yield InferenceRunner(
            policy, device=model.device, dtype=model.dtype, compile=model.compile, cuda_graphs=model.cuda_graphs
        )
        return
    process = PolicyProcess.spawn()
    try:
        await anyio.to_thread.run_sync(process.load, model, search_path)
        yield process
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(process.close)
