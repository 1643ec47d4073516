"""Busy listening ports are refused at start-up in one line naming them (servo.cli.ports, servo-serve)."""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from servo.cli.ports import PortInUseError, free_ports_advice, refuse_busy
from tests.edge.harness import Proc
from tests.support import free_port

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def held() -> Iterator[int]:
    """A loopback TCP port some other program is listening on."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield other.getsockname()[1]


def test_free_ports_pass() -> None:
    refuse_busy([f"tcp/127.0.0.1:{free_port()}", "tcp/127.0.0.1:0"], "127.0.0.1", free_port())


def test_busy_zenoh_port_is_named(held: int) -> None:
    with pytest.raises(PortInUseError) as error:
        refuse_busy([f"tcp/127.0.0.1:{held}"], "127.0.0.1", 0)
    assert str(error.value) == f"port {held} (zenoh.listen tcp/127.0.0.1:{held}) is already in use"


def test_busy_health_port_is_named(held: int) -> None:
    with pytest.raises(PortInUseError) as error:
        refuse_busy([f"tcp/127.0.0.1:{free_port()}"], "127.0.0.1", held)
    assert str(error.value) == f"port {held} (ops.health_port on 127.0.0.1) is already in use"


def test_every_busy_port_in_one_line(held: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        udp_port = udp.getsockname()[1]
        endpoints = [f"tcp/127.0.0.1:{held}", f"udp/127.0.0.1:{udp_port}#iface=lo", f"tcp/127.0.0.1:{free_port()}"]
        with pytest.raises(PortInUseError) as error:
            refuse_busy(endpoints, "127.0.0.1", held)
    assert str(error.value) == (
        f"ports {held} (zenoh.listen tcp/127.0.0.1:{held}), {udp_port} (zenoh.listen {endpoints[1]}) "
        f"and {held} (ops.health_port on 127.0.0.1) are already in use"
    )


@pytest.mark.wildcard
def test_a_listener_on_all_interfaces_holds_loopback_too() -> None:
    with socket.socket() as other:
        other.bind(("0.0.0.0", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"port {port} "):
            refuse_busy([f"tcp/127.0.0.1:{port}"], "127.0.0.1", 0)


def test_unix_sockets_and_ephemeral_ports_are_not_checked(held: int) -> None:
    refuse_busy([f"unixsock-stream/tmp/servo-{held}.sock", "tcp/127.0.0.1:0"], "127.0.0.1", 0)


def test_port_of_a_server_that_just_stopped_is_free() -> None:
    # Servers (anyio, zenoh) listen with SO_REUSEADDR; their closed connections linger in
    # FIN_WAIT/TIME_WAIT on the port, which must not count as busy: a restart may listen there.
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    with socket.create_connection(("127.0.0.1", port)) as client:
        accepted, _ = listener.accept()
        listener.close()
        accepted.close()  # the server side closes first, so its end lingers on `port`
        assert client.recv(1) == b""
    refuse_busy([f"tcp/127.0.0.1:{port}"], "127.0.0.1", 0)


@pytest.mark.parametrize("which", ["zenoh", "health"])
def test_servo_serve_refuses_a_busy_port_in_one_line_whose_advice_works(held: int, which: str) -> None:
    zenoh_port, health_port = (held, free_port()) if which == "zenoh" else (free_port(), held)
    ports = ["--listen", f"tcp/127.0.0.1:{zenoh_port}", "--health-port", str(health_port)]
    serve = [sys.executable, "-m", "servo.cli.serve", str(REPO / "examples" / "manifest.toml")]
    done = subprocess.run([*serve, *ports], capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
    assert done.returncode == 2, done.stderr
    setting = f"zenoh.listen tcp/127.0.0.1:{held}" if which == "zenoh" else "ops.health_port on 127.0.0.1"
    (line,) = done.stderr.splitlines()
    head = f"servo-serve: error: port {held} ({setting}) is already in use (another servo-serve?); "
    assert line.startswith(head + "stop it, or choose free ports: ")
    advice = shlex.split(line.split("choose free ports: ", 1)[1])
    flag = "--listen" if which == "zenoh" else "--health-port"
    assert advice[0] == flag
    assert len(advice) == 2
    # The advice, as given, starts the server (the other port as it was).
    given = dict(zip(ports[::2], ports[1::2], strict=True)) | {advice[0]: advice[1]}
    server = Proc([*serve, *(arg for pair in given.items() for arg in pair), "--log-level", "warning"], cwd=REPO)
    try:
        server.wait_line("servo-serve: ready", 120)
    finally:
        server.stop()


def test_the_advice_moves_every_busy_port_and_keeps_the_rest_of_each_setting(held: int) -> None:
    with pytest.raises(PortInUseError) as error:
        refuse_busy(
            [f"tcp/127.0.0.1:{held}?rel=1#iface=lo"],
            "127.0.0.1",
            held,
            others=[("frontends.openpi.listen", "127.0.0.1", held)],
        )
    flags = {"zenoh.listen": "--listen", "ops.health_port": "--health-port", "frontends.openpi.listen": "--openpi"}
    advice = shlex.split(free_ports_advice(error.value, flags))
    free = error.value.busy[0].free
    assert free is not None
    assert free > held
    assert advice == [
        *("--listen", f"tcp/127.0.0.1:{free}?rel=1#iface=lo"),
        *("--health-port", str(free)),
        *("--openpi", f"127.0.0.1:{free}"),
    ]
