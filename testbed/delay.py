"""A userspace delay line for a link's packets: NFQUEUE verdicts given late (this kernel has no netem).

Run inside the network namespace whose packets ``iptables -j NFQUEUE`` hands to userspace (one
queue per direction, see `testbed.netns`)::

    python -m testbed.delay --queue 1 --queue 2 --min-ms 50 --max-ms 200

Every packet of a queue is held for a delay drawn uniformly from ``[min_ms, max_ms]``, but never
released before the packet ahead of it: packets stay in order, as on a link whose queueing delay
varies (a congested radio link), not as on one that reorders them (netem's jitter without a rate).
A burst therefore leaves with the largest delay drawn among its packets.

The kernel's queue is read over a raw ``NETLINK_NETFILTER`` socket (the nfnetlink_queue protocol:
bind, copy metadata only, then one batch verdict per queue releases every packet up to an id), so
nothing beyond the standard library is needed. Prints ``READY`` once both queues are bound, and
on SIGTERM a line with the packets it delayed and the delays' spread.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from collections import deque
from dataclasses import dataclass, field

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 2, 3
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
SOL_NETLINK, NETLINK_NO_ENOBUFS = 270, 5
SO_RCVBUFFORCE = 33
#: Packets a queue may hold: 200 ms of a 100 Mbit/s link in full-size packets is ~1,700.
QUEUE_MAXLEN = 16_384

_NLMSG = struct.Struct("=IHHII")
_NFGEN = struct.Struct("=BBH")
_ATTR = struct.Struct("=HH")


def _attr(kind: int, payload: bytes) -> bytes:
    body = _ATTR.pack(_ATTR.size + len(payload), kind) + payload
    return body + b"\0" * (-len(body) % 4)


def _message(kind: int, queue: int, attrs: bytes, seq: int) -> bytes:
    body = _NFGEN.pack(socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    header = _NLMSG.pack(_NLMSG.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, NLM_F_REQUEST | NLM_F_ACK, seq, 0)
    return header + body


@dataclass
class DelayLine:
    """One queue (one direction): packets waiting, in arrival order, with their release times."""

    queue: int
    waiting: deque[tuple[float, int]] = field(default_factory=deque)
    last_release: float = 0.0
    delayed: int = 0


class Delayer:
    """Holds every packet of its queues for a random delay, order kept; owned by its one thread."""

    def __init__(self, queues: list[int], min_ms: float, max_ms: float, seed: int | None = None) -> None:
        self.lines = {q: DelayLine(q) for q in queues}
        self.min_s, self.max_s = min_ms / 1e3, max_ms / 1e3
        self.rng = random.Random(seed)
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)
        self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        self.sock.bind((0, 0))
        self._seq = 0
        for q in queues:
            self._config(q, _attr(NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, socket.AF_UNSPEC)))
            self._config(q, _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)))
            self._config(q, _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN)))

    def _config(self, queue: int, attrs: bytes) -> None:
        self._seq += 1
        self.sock.send(_message(NFQNL_MSG_CONFIG, queue, attrs, self._seq))
        reply = self.sock.recv(65536)
        _, kind, _, _, _ = _NLMSG.unpack_from(reply)
        if kind == NLMSG_ERROR and (error := struct.unpack_from("=i", reply, _NLMSG.size)[0]) != 0:
            raise OSError(-error, f"nfnetlink_queue config of queue {queue}: {os.strerror(-error)}")

    def _on_packet(self, queue: int, packet_id: int, now: float) -> None:
        line = self.lines[queue]
        release = max(now + self.rng.uniform(self.min_s, self.max_s), line.last_release)
        line.last_release = release
        line.waiting.append((release, packet_id))

    def _release(self, now: float) -> None:
        for line in self.lines.values():
            last = None
            while line.waiting and line.waiting[0][0] <= now:
                _, last = line.waiting.popleft()
                line.delayed += 1
            if last is not None:
                verdict = _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, last))
                self._seq += 1
                header = _NLMSG.pack(
                    _NLMSG.size + _NFGEN.size + len(verdict),
                    (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_VERDICT_BATCH,
                    NLM_F_REQUEST,
                    self._seq,
                    0,
                )
                self.sock.send(header + _NFGEN.pack(socket.AF_UNSPEC, 0, socket.htons(line.queue)) + verdict)

    def _read(self, now: float) -> None:
        data = self.sock.recv(1 << 20)
        offset = 0
        while offset + _NLMSG.size <= len(data):
            length, kind, _, _, _ = _NLMSG.unpack_from(data, offset)
            if length < _NLMSG.size:
                break
            if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                _, _, queue = _NFGEN.unpack_from(data, offset + _NLMSG.size)
                at = offset + _NLMSG.size + _NFGEN.size
                while at + _ATTR.size <= offset + length:
                    size, attr = _ATTR.unpack_from(data, at)
                    if attr & 0x7FFF == NFQA_PACKET_HDR:
                        (packet_id,) = struct.unpack_from("!I", data, at + _ATTR.size)
                        self._on_packet(socket.ntohs(queue), packet_id, now)
                        break
                    at += (size + 3) & ~3
            offset += (length + 3) & ~3

    def run(self, stop: list[bool]) -> None:
        """Delay packets until ``stop[0]`` (set by a signal handler)."""
        while not stop[0]:
            now = time.monotonic()
            self._release(now)
            due = [line.waiting[0][0] for line in self.lines.values() if line.waiting]
            timeout = max(0.0, min(due) - time.monotonic()) if due else 0.2
            try:
                ready, _, _ = select.select([self.sock], [], [], timeout)
            except InterruptedError:
                continue
            if ready:
                self._read(time.monotonic())
        self._release(float("inf"))  # nothing stays held when the delay line stops

    def spread_ms(self) -> str:
        """Packets delayed per queue."""
        return ", ".join(f"queue {q}: {line.delayed} packets" for q, line in self.lines.items())


def main(argv: list[str] | None = None) -> int:
    """Bind the queues, print READY, delay packets until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queue", type=int, action="append", required=True, help="NFQUEUE number (repeat)")
    parser.add_argument("--min-ms", type=float, required=True, help="shortest delay of a packet (ms)")
    parser.add_argument("--max-ms", type=float, required=True, help="longest delay drawn for a packet (ms)")
    parser.add_argument("--seed", type=int, help="random seed (default: fresh)")
    args = parser.parse_args(argv)
    if not 0 <= args.min_ms <= args.max_ms:
        parser.error("--min-ms must be >= 0 and <= --max-ms")
    delayer = Delayer(args.queue, args.min_ms, args.max_ms, args.seed)
    stop = [False]

    def on_signal(*_: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with contextlib.suppress(OSError):
        # The network is not the robot's CPU: above the machine's load when allowed (root).
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    print("READY", flush=True)
    delayer.run(stop)
    print(f"delayed {delayer.spread_ms()}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
