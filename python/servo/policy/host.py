"""The policy process: one policy on its device, serving forwards for the server that started it.

``servo-serve`` keeps the network, the sessions and every check in its own process and runs the
policy here (``model.process = "separate"``, `servo.server.policy_process`), so the process a
robot is connected to never maps torch: killed, it is gone at once and its robots move to another
replica, while a process holding torch and a CUDA context takes the kernel a second or more to
tear down on a busy machine before its sockets close (``benches/results/failover.md``).

Started as ``python -m servo.policy.host FD [--log-level L] [--json-logs]`` with FD one end of an
anonymous socketpair (`servo.policy.channel`). It answers one message at a time, in order, and
ends when the server closes the link or exits: the kernel kills it with its parent (Linux
``PR_SET_PDEATHSIG``), and it ignores the terminal's Ctrl-C and a SIGTERM sent to the whole group,
because the server drains first and closes the link when its last forward is answered.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import NoReturn

from servo.logs import configure_logging, get_logger
from servo.policy.channel import (
    Arrays,
    Body,
    Channel,
    ChannelClosed,
    Chunk,
    Durations,
    Failed,
    Failure,
    Infer,
    Load,
    Loaded,
    Message,
    Outcomes,
    Timed,
    Warmup,
)
from servo.policy.loader import load_policy
from servo.policy.protocol import Processor
from servo.policy.runner import InferenceRunner

log = get_logger(__name__)

_PR_SET_PDEATHSIG = 1


class PolicyHost:
    """Answers the server's messages. Owned by the process's main thread, the only one it uses."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._runner: InferenceRunner | None = None
        self._processors: dict[int, Processor] = {}

    def serve(self) -> None:
        """Answer messages until the server closes the link (`ChannelClosed`)."""
        while True:
            message, arrays = self._channel.receive()
            if isinstance(message, Load):
                self._load(message)
            elif isinstance(message, Warmup):
                self._durations(
                    functools.partial(InferenceRunner.warmup, count=message.count, batch_sizes=message.batch_sizes)
                )
            elif isinstance(message, Timed):
                self._durations(functools.partial(InferenceRunner.timed_forwards, count=message.count))
            elif isinstance(message, Infer):
                self._infer(message, arrays)
            else:
                raise ChannelClosed(f"the server sent a {type(message).__name__}, which only a policy process sends")

    def _infer(self, message: Infer, arrays: Arrays) -> None:
        runner = self._loaded()
        for key in message.dropped:
            self._processors.pop(key, None)
        for key in message.resets:
            if (processor := self._processors.get(key)) is not None:
                processor.reset()
        if message.reset_policy:
            runner.policy.reset()
        requests = [(self._processor(r.processor), arrays.observation(r), r.delay) for r in message.requests]
        body = Body()
        outcomes: list[Chunk | Failure] = [
            _failure(o) if isinstance(o, Exception) else Chunk(body.add(o[0]), body.add(o[1]))
            for o in runner.infer_batch(requests)
        ]
        self._channel.send(Outcomes(outcomes), body)

    def _load(self, message: Load) -> None:
        reply: Message
        try:
            policy = load_policy(
                message.source, message.options, device=message.device, search_path=message.search_path
            )
            runner = self._runner = InferenceRunner(
                policy,
                device=message.device,
                dtype=message.dtype,
                compile=message.compile,
                cuda_graphs=message.cuda_graphs,
            )
            reply = Loaded(runner.spec, runner.batching)
        except Exception as exc:
            log.debug("loading the policy failed", exc_info=exc)
            reply = Failed(_failure(exc))
        self._channel.send(reply)

    def _durations(self, run: Callable[[InferenceRunner], list[float]]) -> None:
        reply: Message
        try:
            reply = Durations(run(self._loaded()))
        except Exception as exc:
            log.debug("forwards failed", exc_info=exc)
            reply = Failed(_failure(exc))
        self._channel.send(reply)

    def _loaded(self) -> InferenceRunner:
        if self._runner is None:
            raise ChannelClosed("the server asked for a forward before the policy was loaded")
        return self._runner

    def _processor(self, key: int) -> Processor:
        processor = self._processors.get(key)
        if processor is None:
            processor = self._processors[key] = self._loaded().policy.make_processor()
        return processor


def _failure(exc: BaseException) -> Failure:
    return Failure(type(exc).__name__, str(exc), exc.name if isinstance(exc, ModuleNotFoundError) else None)


def _die_with_parent() -> None:
    """Have the kernel SIGKILL this process when the server exits (Linux; elsewhere the link's EOF does)."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        log.warning("cannot follow the server's exit", errno=ctypes.get_errno())


def main(argv: list[str] | None = None) -> NoReturn:
    """Serve the server at the other end of FD until it closes the link or exits."""
    parser = argparse.ArgumentParser(prog="servo.policy.host", description=__doc__.splitlines()[0])
    parser.add_argument("fd", type=int, help="this end of the server's socketpair")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--json-logs", action="store_true")
    args = parser.parse_args(argv)
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # the server died before the line above: nobody to serve
        os._exit(0)
    # The server drains on the first Ctrl-C or SIGTERM and closes the link after its last forward.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    configure_logging(args.log_level, json=args.json_logs)
    channel = Channel(socket.socket(fileno=args.fd), arena="reads")
    try:
        PolicyHost(channel).serve()
    except ChannelClosed as exc:
        log.debug("policy process ends", reason=str(exc))
    # Closed here, not by the exit: the kernel closes a dead process's sockets only after unmapping
    # its memory, and the server waits for this close, not for that.
    channel.close()
    # The interpreter's teardown is skipped, as the command-line tools do (servo.cli.lifecycle).
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
