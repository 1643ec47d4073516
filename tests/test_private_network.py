"""The run listens on a network of its own (root conftest): no test opens a port on a real network."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from conftest import PRIVATE_LAN_ADDRESS, in_private_network


@pytest.fixture
def private(pytestconfig: pytest.Config) -> None:
    """Only where the run made its namespace: as root, unless SERVO_TEST_NETWORK=host."""
    if os.geteuid() == 0 and os.environ.get("SERVO_TEST_NETWORK") != "host":
        assert in_private_network(pytestconfig)  # root can always make one: not making it is a bug
    elif not in_private_network(pytestconfig):
        pytest.skip("the run keeps the host's network (not root, or SERVO_TEST_NETWORK=host)")


@pytest.mark.usefixtures("private")
def test_the_run_has_a_network_namespace_of_its_own_with_loopback_and_one_private_address() -> None:
    assert os.readlink("/proc/self/ns/net") != os.readlink(f"/proc/{os.getppid()}/ns/net")  # the shell that ran pytest
    shown = subprocess.run(["ip", "-o", "-4", "addr"], check=True, capture_output=True, text=True).stdout
    addresses = sorted(line.split()[3] for line in shown.splitlines())
    assert addresses == ["10.254.0.1/24", "127.0.0.1/8"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # what "this host's address" finds
        probe.connect(("192.0.2.1", 9))
        assert probe.getsockname()[0] == PRIVATE_LAN_ADDRESS


@pytest.mark.usefixtures("private")
def test_processes_the_run_starts_share_its_network() -> None:
    child = subprocess.run(["readlink", "/proc/self/ns/net"], check=True, capture_output=True, text=True).stdout
    assert child.strip() == os.readlink("/proc/self/ns/net")
