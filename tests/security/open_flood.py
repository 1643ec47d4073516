"""A stranger flooding a server with genuine session opens, in its own process (tests/security).

``python -m tests.security.open_flood --port P --prefix @servo/app/model/replica --rate 200``
joins the server's endpoint and sends ``--rate`` session opens a second until killed, each under a
fresh client id and signed by a fresh robot identity with the nonce of the replica's status: every
one of them is valid, and the server cannot tell them from new robots (issue 18: 150 such opens a
second exhausted the open budget and the legitimate robot, reconnecting, gave up). Queries are
fire-and-forget. Prints ``SENT n`` when it stops (SIGTERM).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from types import FrameType

import zenoh
from zenoh.handlers import Callback

from servo._core import KeyPair
from servo.client.trust import signed_open
from servo.identity import Identity
from servo.transport import ZenohSettings
from servo.wire import SUPPORTED_SCHEMA_VERSIONS, SessionOpen, StatusReply, decode, encode

#: How often the flood asks the replica's status again for a nonce it still accepts (s).
NONCE_REFRESH_S = 10.0


def status(z: zenoh.Session, prefix: str) -> StatusReply:
    """The replica's status (its nonce, its features), asked like any robot asks it."""
    for reply in z.get(f"{prefix}/status", timeout=5):
        if reply.ok is not None:
            return decode(reply.ok.payload.to_bytes(), StatusReply)
    raise SystemExit(f"open_flood: {prefix} does not answer its status")


def flood(z: zenoh.Session, prefix: str, rate: float, stop: threading.Event) -> int:
    """Send opens at ``rate`` per second until ``stop``; how many were sent."""
    sent, started, refreshed = 0, time.monotonic(), 0.0
    current = status(z, prefix)
    while not stop.is_set():
        now = time.monotonic()
        if now - refreshed > NONCE_REFRESH_S:
            current, refreshed = status(z, prefix), now
        client_id = f"flood-{sent}"
        request = SessionOpen(
            client_id=client_id,
            schema_versions=list(SUPPORTED_SCHEMA_VERSIONS),
            features=current.policy.features,
            fps=current.policy.fps,
            client_key=KeyPair().public_key,
        )
        request = signed_open(request, Identity.generate(), prefix=prefix, nonce=current.nonce)
        z.get(f"{prefix}/c/{client_id}/session", Callback(lambda _reply: None), payload=encode(request), timeout=2)
        sent += 1
        ahead = started + sent / rate - time.monotonic()
        if ahead > 0:
            stop.wait(ahead)
    return sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--prefix", required=True, help="The replica's key prefix, @servo/<app>/<model>/<replica>.")
    parser.add_argument("--rate", type=float, default=200.0, help="Opens per second.")
    args = parser.parse_args()
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    settings = ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{args.port}"])
    with zenoh.open(settings.to_config()) as z:
        print("FLOODING", flush=True)
        sent = flood(z, args.prefix, args.rate, stop)
    print(f"SENT {sent}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
