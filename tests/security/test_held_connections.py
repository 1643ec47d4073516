"""A stranger holding connections open in their handshake locks no robot out of a server.

Found while reviewing issue 29's doors: Zenoh's listener holds at most ``accept_pending`` links in
their handshake (100 by default) and refuses new ones beyond. A stranger on the LAN that opened
101 connections to a ``tls/`` server, finished TLS (no client certificate is asked for) and then
sent nothing locked every robot out: a robot's dial timed out until the stranger let go, and a
stranger that reconnects every 10 s never lets go. servo's listeners now hold `ACCEPT_PENDING`
and free a silent link after `ACCEPT_TIMEOUT_MS`.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from servo.server.manifest import parse_manifest
from servo.transport.config import ACCEPT_PENDING, ACCEPT_TIMEOUT_MS
from servo.transport.zsession import OPEN_FILES
from tests.support import running_server
from tests.transport.test_tls import edge_settings, infer_once, make_pki, tls_manifest

pytestmark = pytest.mark.anyio

#: Connections the stranger holds: three times what Zenoh's default let through.
HELD = 300
ZENOH_DEFAULT_PENDING = 100


class Holder:
    """A stranger that keeps ``count`` TLS connections open to ``port``, silent after the handshake.

    Each one the server closes is opened again, so at any moment about ``count`` are held.
    """

    def __init__(self, port: int, count: int) -> None:
        self.port, self.count = port, count
        self.context = ssl.create_default_context()
        self.context.check_hostname = False
        self.context.verify_mode = ssl.CERT_NONE  # a stranger trusts nothing and needs nothing
        self.held: list[ssl.SSLSocket] = []
        self.full = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="stranger", daemon=True)

    def still_held(self) -> int:
        """How many of the stranger's connections the server has not closed (any thread)."""
        return sum(_still_open(s) for s in list(self.held))

    def _run(self) -> None:
        while not self.stop.is_set():
            self.held = [s for s in self.held if _still_open(s)]
            while len(self.held) < self.count and not self.stop.is_set():
                raw = socket.create_connection(("127.0.0.1", self.port), timeout=10)
                self.held.append(self.context.wrap_socket(raw))
            self.full.set()
            self.stop.wait(0.05)  # pace the top-up; the robot's dial is what the test waits for

    @contextlib.contextmanager
    def holding(self) -> Iterator[Holder]:
        self.thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            self.thread.join(30)
            for held in self.held:
                held.close()


def _still_open(held: ssl.SSLSocket) -> bool:
    # Peek below TLS: a closed connection reads b"", an open one has nothing or a TLS record.
    try:
        return socket.socket.recv(held, 1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def _closed_by_server(held: ssl.SSLSocket, within_s: float) -> bool:
    held.settimeout(within_s)
    deadline = time.monotonic() + within_s
    with contextlib.suppress(OSError):
        while time.monotonic() < deadline:
            if socket.socket.recv(held, 4096) == b"":
                return True
    return False


async def test_a_stranger_holding_connections_open_locks_no_robot_out(tmp_path: Path, port: int) -> None:
    assert ACCEPT_PENDING > HELD > ZENOH_DEFAULT_PENDING
    pki = make_pki(tmp_path, "lab")
    async with running_server(parse_manifest(tls_manifest(port, pki, mtls=False))):
        with Holder(port, HELD).holding() as stranger:
            assert await anyio.to_thread.run_sync(stranger.full.wait, 120), "the stranger never held its connections"
            # More than Zenoh's default allows are held as the robot dials, or this proves nothing.
            assert stranger.still_held() > ZENOH_DEFAULT_PENDING
            assert await infer_once(edge_settings(port, pki["ca"])) == (50, 6)
            # A silent link is not held for ever: the server closes it after the accept timeout.
            stranger.stop.set()
            stranger.thread.join(30)
            assert await anyio.to_thread.run_sync(_closed_by_server, stranger.held[-1], ACCEPT_TIMEOUT_MS / 1000 + 10)


def test_a_listening_process_raises_its_open_file_limit_to_hold_its_pending_links(port: int) -> None:
    """A soft limit of 1024 descriptors (common) runs out before 1024 pending links do."""
    code = f"""
import resource, anyio
from servo.transport import ZenohSettings, open_zsession
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
async def main():
    async with open_zsession(ZenohSettings(listen=["tcp/127.0.0.1:{port}"])):
        print(*resource.getrlimit(resource.RLIMIT_NOFILE))
anyio.run(main)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    soft, hard = (int(n) for n in done.stdout.split())
    wanted = OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES)
    assert soft == wanted  # up to the hard limit, never above it
