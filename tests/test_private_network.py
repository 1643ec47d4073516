"""The run listens on a network of its own (root conftest): no test opens a port on a real network."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from conftest import PRIVATE_LAN_ADDRESS


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace of the run needs root")
def test_the_run_has_a_network_namespace_of_its_own_with_loopback_and_one_private_address() -> None:
    assert os.readlink("/proc/self/ns/net") != os.readlink(f"/proc/{os.getppid()}/ns/net")  # the shell that ran pytest
    shown = subprocess.run(["ip", "-o", "-4", "addr"], check=True, capture_output=True, text=True).stdout
    addresses = sorted(line.split()[3] for line in shown.splitlines())
    assert addresses == ["10.254.0.1/24", "127.0.0.1/8"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # what "this host's address" finds
        probe.connect(("192.0.2.1", 9))
        assert probe.getsockname()[0] == PRIVATE_LAN_ADDRESS


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace of the run needs root")
def test_processes_the_run_starts_share_its_network() -> None:
    child = subprocess.run(["readlink", "/proc/self/ns/net"], check=True, capture_output=True, text=True).stdout
    assert child.strip() == os.readlink("/proc/self/ns/net")
