"""A hostile peer flooding a policy server, in its own process (bench_security.py, tests/security).

``python -m benches._flood --port P --prefix @servo/app/model/replica --victim robot --count N``
joins the server's endpoint in client mode, sniffs the victim's sealed observations and control
requests (what anyone on a flat network sees) and sends ``N`` hostile messages at the server's
keys as fast as it can, from a seeded mix:

* 70 % observations: the victim's sniffed ones with bytes flipped in the header or the body
  (each costs the server a MAC check), replays, and random headers and bodies on random and
  hostile client ids (control characters, the longest allowed names);
* 20 % session opens: mutated genuine opens under random client ids, oversized ones, and
  opens with control characters in the id, the task and the tags;
* 10 % control requests: the victim's sniffed reset with bytes flipped, and random ones.

Queries are fire-and-forget (replies dropped) with at most ``--in-flight`` outstanding, so the
flood measures the server, not this process's memory. Prints ``SENT n`` when done.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import threading
import time

import zenoh
from zenoh.handlers import Callback

from servo._core import MSG_CONTROL, MSG_OBS, SCHEMA_VERSION, Header, KeyPair, unauthenticated
from servo.transport import ZenohSettings
from servo.wire import Features, SessionOpen, encode

HOSTILE_IDS = ("evil\x1b]0;owned\x07", "robot\r\nERROR fake", "x" * 128, "\u202eoverride", "nul\x00byte")


def _flip(data: bytes, rng: random.Random, n: int = 3) -> bytes:
    if not data:
        return bytes(rng.randrange(256) for _ in range(16))
    out = bytearray(data)
    for _ in range(n):
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


class Flood:
    """Sends the mix; owned by the thread that calls `run` (the sniffer fills `sniffed` from
    Zenoh's callback thread under a lock)."""

    def __init__(self, z: zenoh.Session, prefix: str, victim: str, seed: int, in_flight: int) -> None:
        self._z, self._prefix, self._victim = z, prefix, victim
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._sniffed: list[tuple[bytes, bytes]] = []
        self._in_flight = in_flight
        self._slots = threading.BoundedSemaphore(in_flight)
        self.sniffed_one = threading.Event()
        self._sub = z.declare_subscriber(f"{prefix}/c/{victim}/obs", Callback(self._sniff, indirect=False))
        self._open = encode(
            SessionOpen(
                client_id="flood",
                schema_versions=[SCHEMA_VERSION],
                features=Features(state_names=["a"], action_names=["a"], cameras={}),
                fps=30.0,
                client_key=KeyPair().public_key,
            )
        )

    def _sniff(self, sample: zenoh.Sample) -> None:
        if sample.attachment is not None:
            with self._lock:
                if len(self._sniffed) < 64:
                    self._sniffed.append((sample.attachment.to_bytes(), sample.payload.to_bytes()))
            self.sniffed_one.set()

    def _client(self) -> str:
        rng = self._rng
        return rng.choice(HOSTILE_IDS) if rng.random() < 0.3 else f"flood-{rng.randrange(10**9)}"

    def _query(self, key: str, payload: bytes, attachment: bytes | None) -> None:
        self._slots.acquire()
        try:
            self._z.get(
                key,
                Callback(lambda _reply: None, self._slots.release),
                payload=payload,
                attachment=attachment,
                timeout=2.0,
            )
        except zenoh.ZError:
            self._slots.release()

    def _observation(self) -> None:
        rng = self._rng
        with self._lock:
            sniffed = rng.choice(self._sniffed) if self._sniffed else None
        if sniffed is not None and rng.random() < 0.6:
            attachment, body = sniffed
            what = rng.random()
            if what < 0.4:
                attachment = _flip(attachment, rng)
            elif what < 0.8:
                body = _flip(body, rng, n=rng.randrange(1, 8))
            self._z.put(f"{self._prefix}/c/{self._victim}/obs", body, attachment=attachment)
            return
        header = Header(SCHEMA_VERSION, MSG_OBS, 0, rng.randrange(1, 2**32), 0, 0, 0, rng.randbytes(16))
        body = rng.randbytes(rng.choice((0, 16, 256, 4096)))
        attachment = unauthenticated(header) if rng.random() < 0.7 else rng.randbytes(rng.randrange(64))
        with contextlib.suppress(zenoh.ZError):  # a key zenoh itself refuses
            self._z.put(f"{self._prefix}/c/{self._client()}/obs", body, attachment=attachment)

    def _session_open(self) -> None:
        rng = self._rng
        client = self._client()
        what = rng.random()
        if what < 0.5:
            payload = _flip(self._open, rng, n=rng.randrange(1, 6))
        elif what < 0.7:
            payload = rng.randbytes(64 * 1024 + rng.randrange(1024))  # over the control bound
        else:
            payload = encode(
                {
                    "client_id": client,
                    "schema_versions": [SCHEMA_VERSION],
                    "features": {"state_names": [], "action_names": [], "cameras": {}},
                    "fps": 30.0,
                    "client_key": rng.randbytes(32),
                    "task": "t\x1b[2J" * 2000,
                    "tags": {"k\x1b": "\r\nERROR forged" * 50},
                }
            )
        with contextlib.suppress(zenoh.ZError):
            self._query(f"{self._prefix}/c/{client}/session", payload, None)

    def _control(self) -> None:
        rng = self._rng
        header = Header(SCHEMA_VERSION, MSG_CONTROL, 0, rng.randrange(1, 2**32), 0, 0, 0, rng.randbytes(16))
        attachment = unauthenticated(header)
        with self._lock:
            if self._sniffed and rng.random() < 0.5:
                attachment = _flip(rng.choice(self._sniffed)[0], rng)
        self._query(f"{self._prefix}/c/{self._victim}/control", rng.randbytes(rng.randrange(64)), attachment)

    def run(self, count: int) -> int:
        """Send ``count`` messages; returns how many were sent."""
        for _ in range(count):
            what = self._rng.random()
            if what < 0.7:
                self._observation()
            elif what < 0.9:
                self._session_open()
            else:
                self._control()
        return count

    def close(self, timeout: float) -> None:
        """Wait for the outstanding queries (answered or timed out), undeclare the sniffer."""
        for _ in range(self._in_flight):
            self._slots.acquire(timeout=timeout)
        self._sub.undeclare()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benches._flood")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--prefix", required=True, help="the server's key prefix (@servo/app/model/replica)")
    parser.add_argument("--victim", required=True, help="the client id whose keys are attacked")
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--in-flight", type=int, default=64)
    args = parser.parse_args(argv)
    settings = ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{args.port}"])
    with zenoh.open(settings.to_config()) as z:
        flood = Flood(z, args.prefix, args.victim, args.seed, args.in_flight)
        # The victim streams: its observations are what a sniffer mutates best.
        flood.sniffed_one.wait(5.0)
        started = time.perf_counter()
        try:
            sent = flood.run(args.count)
        finally:
            flood.close(timeout=5.0)
    print(f"SENT {sent} IN {time.perf_counter() - started:.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
