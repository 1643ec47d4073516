"""A real slow link: a network namespace behind a veth pair shaped with ``tc tbf``.

Needs root and ``ip``/``tc`` (`available`); benches/bench_link.py and
tests/transport/test_slow_link.py use it. The
host keeps one end of the veth, the namespace the other, and both directions are shaped to
``rate_mbit`` (observations leave through the host end, chunks through the namespace end).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from testbed.processes import free_port


@dataclass(frozen=True)
class Link:
    """A namespace reached from the host through a shaped veth pair."""

    namespace: str
    host_veth: str
    server_ip: str


def available() -> bool:
    """Whether this process may create namespaces and shape links."""
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True)


@contextmanager
def shaped_link(rate_mbit: int) -> Iterator[Link]:
    """Create the namespace and veth, shape both ends to ``rate_mbit``; delete everything on exit."""
    tag = f"{os.getpid() % 10_000}{free_port() % 100}"
    ns, host, peer = f"servo-bench-{tag}", f"sbh{tag}", f"sbp{tag}"
    subnet = f"10.{200 + os.getpid() % 50}.{free_port() % 250}"
    _run("ip", "netns", "add", ns)
    try:
        _run("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
        _run("ip", "link", "set", peer, "netns", ns)
        _run("ip", "addr", "add", f"{subnet}.1/30", "dev", host)
        _run("ip", "link", "set", host, "up")
        _run("ip", "-n", ns, "addr", "add", f"{subnet}.2/30", "dev", peer)
        _run("ip", "-n", ns, "link", "set", peer, "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        shape = ["root", "tbf", "rate", f"{rate_mbit}mbit", "burst", "32kbit", "latency", "20ms"]
        _run("tc", "qdisc", "add", "dev", host, *shape)
        _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", peer, *shape)
        yield Link(ns, host, f"{subnet}.2")
    finally:
        subprocess.run(["ip", "link", "del", host], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
