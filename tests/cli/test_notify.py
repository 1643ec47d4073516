"""systemd's notify protocol, driven by the test over sockets it creates: a real ``servo-serve`` and a
real ``servo-edge --robot sim`` each get ``$NOTIFY_SOCKET`` and ``$WATCHDOG_USEC`` as a
``Type=notify`` unit with ``WatchdogSec=`` would give them."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from servo.systemd import Notifier
from tests.edge.harness import Proc, edge_argv, write_manifest
from tests.support import free_port

#: The watchdog timeout handed to the processes: pings every 0.2 s.
WATCHDOG_USEC = 400_000


class NotifySocket:
    """The service manager's end: a datagram socket whose messages a reader thread collects."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self._sock.settimeout(0.2)
        self._cond = threading.Condition()
        self.messages: list[tuple[float, list[str]]] = []  # (monotonic arrival, lines)
        self._closed = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._closed:
            try:
                data = self._sock.recv(4096)
            except TimeoutError:
                continue
            with self._cond:
                self.messages.append((time.monotonic(), data.decode().split("\n")))
                self._cond.notify_all()

    def lines(self, since: float = 0.0) -> list[str]:
        with self._cond:
            return [line for at, lines in self.messages if at >= since for line in lines]

    def wait_for(self, check: Callable[[list[str]], bool], timeout: float, what: str, since: float = 0.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: check(self.lines(since)), timeout):
                raise AssertionError(f"{what} not notified within {timeout} s; got {self.lines()}")

    def env(self) -> dict[str, str]:
        return {"NOTIFY_SOCKET": self.address, "WATCHDOG_USEC": str(WATCHDOG_USEC)}

    def close(self) -> None:
        self._closed = True
        self._reader.join(5)
        self._sock.close()


@pytest.fixture
def notify_socket() -> Iterator[Callable[[str], NotifySocket]]:
    sockets: list[NotifySocket] = []

    def make(address: str) -> NotifySocket:
        sockets.append(NotifySocket(address))
        return sockets[-1]

    yield make
    for s in sockets:
        s.close()


def pings(lines: list[str]) -> int:
    return lines.count("WATCHDOG=1")


def control_process(edge_pid: int) -> int:
    """The edge's control process (its child running servo.edge.control_process)."""
    for task in Path(f"/proc/{edge_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if b"servo.edge.control_process" in Path(f"/proc/{child}/cmdline").read_bytes():
                return int(child)
    raise AssertionError(f"no control process under {edge_pid}")


# ---------------------------------------------------------------------------- the protocol
def test_no_socket_no_notifier() -> None:
    assert Notifier.from_environment({}) is None
    assert Notifier.from_environment({"NOTIFY_SOCKET": "vsock:2:1234"}) is None


def test_watchdog_only_for_this_process() -> None:
    env = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "30000000"}
    mine = Notifier.from_environment({**env, "WATCHDOG_PID": str(os.getpid())})
    theirs = Notifier.from_environment({**env, "WATCHDOG_PID": str(os.getpid() + 1)})
    bad = Notifier.from_environment({**env, "WATCHDOG_USEC": "soon"})
    assert mine is not None
    assert (mine.watchdog_s, mine.ping_interval_s) == (30.0, 15.0)
    assert theirs is not None
    assert theirs.ping_interval_s is None
    assert bad is not None
    assert bad.ping_interval_s is None


@pytest.mark.parametrize("kind", ["path", "abstract"])
def test_datagram_reaches_the_socket(kind: str, tmp_path: Path, notify_socket: Callable[[str], NotifySocket]) -> None:
    address = str(tmp_path / "n") if kind == "path" and len(str(tmp_path)) < 90 else f"@servo-{secrets.token_hex(6)}"
    manager = notify_socket(address)
    assert Notifier(address).send("READY=1", "STATUS=serving")
    manager.wait_for(lambda lines: lines == ["READY=1", "STATUS=serving"], 5, "READY")


def test_a_gone_manager_loses_the_message_quietly() -> None:
    notifier = Notifier(f"@servo-nobody-{secrets.token_hex(6)}")
    assert not notifier.send("READY=1")
    assert not notifier.send("WATCHDOG=1")


# ---------------------------------------------------------------------------- real processes
@pytest.mark.deploy
def test_server_and_edge_notify_ready_watchdog_and_stopping(
    tmp_path: Path, notify_socket: Callable[[str], NotifySocket]
) -> None:
    port = free_port()
    served = notify_socket(f"@servo-serve-{secrets.token_hex(6)}")
    manifest, health = write_manifest(tmp_path / "m.toml", port), free_port()
    argv = [sys.executable, "-m", "servo.cli.serve", str(manifest), "--health-port", str(health), "--log-level", "info"]
    server = Proc(argv, env=served.env())
    edge = None
    try:
        served.wait_for(lambda lines: "READY=1" in lines, 90, "the server's READY")
        with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=10) as reply:
            assert reply.read() == b"serving\n"  # READY once it serves, not before
        served.wait_for(lambda lines: pings(lines) >= 2, 30, "the server's pings")

        robot = notify_socket(f"@servo-edge-{secrets.token_hex(6)}")
        edge = Proc(edge_argv(f"--robot sim --connect tcp/127.0.0.1:{port} --log-level info"), env=robot.env())
        robot.wait_for(lambda lines: "READY=1" in lines, 60, "the edge's READY")
        ready = next(lines for _, lines in robot.messages if "READY=1" in lines)
        assert "STATUS=streaming" in ready  # READY once streaming, in the same message
        assert "STATUS=connecting" in robot.lines()  # and not before
        robot.wait_for(lambda lines: pings(lines) >= 2, 30, "the edge's pings")

        # The control loop hangs: the edge's event loop runs on, but the pings stop (systemd
        # would end and restart the edge after WatchdogSec). One decision taken as the loop
        # stopped may still count ticks from before: at most one ping after the stop.
        control = control_process(edge.popen.pid)
        os.kill(control, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            # An absence is asserted over a window: 15 ping intervals of 0.2 s.
            time.sleep(3.0)
            assert pings(robot.lines(since=stopped_at)) <= 1, robot.lines(since=stopped_at)
        finally:
            os.kill(control, signal.SIGCONT)
        resumed_at = time.monotonic()
        robot.wait_for(lambda lines: pings(lines) >= 1, 30, "pings once the loop ticks again", since=resumed_at)

        edge.popen.send_signal(signal.SIGTERM)
        robot.wait_for(lambda lines: "STOPPING=1" in lines, 30, "the edge's STOPPING")
        assert edge.wait(30) == 0, edge.output

        server.popen.send_signal(signal.SIGTERM)
        served.wait_for(lambda lines: "STOPPING=1" in lines, 30, "the server's STOPPING")
        assert server.wait(60) == 0, server.output
        assert "drained" in server.output
    finally:
        for proc in (edge, server):
            if proc is not None:
                proc.kill()


@pytest.mark.deploy
def test_pings_end_with_the_control_process(tmp_path: Path, notify_socket: Callable[[str], NotifySocket]) -> None:
    """The control process dies: the edge stops pinging and exits with a failure (systemd restarts it)."""
    port = free_port()
    server = Proc([sys.executable, "-m", "servo.cli.serve", str(write_manifest(tmp_path / "m.toml", port))])
    edge = None
    try:
        server.wait_line("ready", 90)
        robot = notify_socket(f"@servo-edge-{secrets.token_hex(6)}")
        edge = Proc(edge_argv(f"--robot sim --connect tcp/127.0.0.1:{port}"), env=robot.env())
        robot.wait_for(lambda lines: pings(lines) >= 1, 60, "the edge's pings")
        os.kill(control_process(edge.popen.pid), signal.SIGKILL)
        killed_at = time.monotonic()
        assert edge.wait(30) == 3, edge.output  # control loop ended: a failure exit
        assert pings(robot.lines(since=killed_at)) <= 1
        assert "control loop ended" in edge.output
    finally:
        for proc in (edge, server):
            if proc is not None:
                proc.kill()
