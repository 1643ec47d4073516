"""A real bad link: a network namespace behind a veth pair, shaped, lossy and jittery on demand.

Needs root and ``ip``/``tc`` (`available`; loss needs ``nft``, delay ``iptables``);
benches/bench_link.py, benches/bench_lossy_link.py and tests/transport/test_slow_link.py use it.
The host keeps one end of the veth, the namespace the other, and both directions are:

* shaped to ``rate_mbit`` with ``tc tbf`` (observations leave through the host end, chunks
  through the namespace end);
* with ``loss_percent``, dropped at random, each packet on its own, in each direction, where it
  arrives: ``nft ... numgen random mod 100 < N drop`` in a ``netdev`` table on the ingress of
  each veth end (one table in the namespace, one of its own on the host, bound to the host's
  veth only and deleted with it). Dropped on arrival, the sender never learns of the loss, as
  on a wire (a drop on the sender's output hook returns EPERM to it at once);
* with ``delay_ms = (lo, hi)``, held for a delay drawn from ``[lo, hi]`` by `testbed.delay`, a
  userspace delay line fed by ``iptables -j NFQUEUE`` in the namespace (this kernel has no
  netem); packets keep their order.

Segmentation offload is off on both ends (``gso_max_segs 1``): every packet that is dropped or
delayed is one wire-sized packet, not a 64 KiB super-packet standing for 45 of them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from testbed.processes import free_port, stop

#: The NFQUEUE numbers of the delay line: packets into the namespace, and out of it.
INBOUND_QUEUE, OUTBOUND_QUEUE = 7301, 7302
#: The retransmission timer's floor on a ``tcp_tuned`` link's routes (Linux's default: 200 ms).
TUNED_RTO_MIN = "50ms"


@dataclass(frozen=True)
class Link:
    """A namespace reached from the host through a shaped veth pair."""

    namespace: str
    host_veth: str
    server_ip: str
    loss_percent: int = 0
    delay_ms: tuple[float, float] | None = None

    def remote(self, *command: str) -> list[str]:
        """``command`` as run on the far host: in the namespace, with a ``/dev/shm`` and a host name of its own.

        Zenoh's shared memory crosses network namespaces (the host's ``/dev/shm`` is one), so a
        process run this way can only reach the host through the link, whatever either end's
        shared-memory setting says, as on two machines. Its own host name keeps a servo server
        from telling a robot it runs on the robot's machine (`servo.wire.keys.on_this_host`),
        where the robot's codec would take the link for memory and send raw frames.
        """
        private_shm = f'mount -t tmpfs -o size=256m servo-shm /dev/shm && hostname {self.namespace} && exec "$@"'
        unshare = ["unshare", "--mount", "--uts", "--propagation", "private"]
        in_namespace = ["ip", "netns", "exec", self.namespace, *unshare]
        return [*in_namespace, "sh", "-c", private_shm, "sh", *command]

    def describe(self) -> str:
        """The impairments, as a table cell: ``20 % loss, 50-200 ms delay``."""
        parts = [f"{self.loss_percent} % loss"] if self.loss_percent else []
        if self.delay_ms is not None:
            parts.append(f"{self.delay_ms[0]:g}-{self.delay_ms[1]:g} ms delay")
        return ", ".join(parts) or "clean"


def available() -> bool:
    """Whether this process may create namespaces and shape links."""
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


def impairments_available() -> bool:
    """Whether `shaped_link` can also drop (nft) and delay (iptables NFQUEUE) packets here."""
    return available() and shutil.which("nft") is not None and shutil.which("iptables") is not None


def _run(*command: str, stdin: str | None = None) -> None:
    subprocess.run(command, check=True, capture_output=True, input=stdin, text=True)


def _loss_rules(device: str, percent: int) -> str:
    """Drop ``percent`` % of the packets that arrive on ``device``, before any protocol sees them."""
    return f"""table netdev servo_loss_{device} {{
    chain arriving {{
        type filter hook ingress device "{device}" priority 0; policy accept;
        numgen random mod 100 < {percent} drop;
    }}
}}
"""


@contextmanager
def shaped_link(
    rate_mbit: int, *, loss_percent: int = 0, delay_ms: tuple[float, float] | None = None, tcp_tuned: bool = False
) -> Iterator[Link]:
    """Create the namespace and veth, shape (and impair) both ends; delete everything on exit.

    ``tcp_tuned``: what an operator can do for TCP on such a link without touching the
    applications (docs/guides/bad-links.md): on the route of each end, a retransmission timer
    floor of `TUNED_RTO_MIN` instead of 200 ms and BBR, which does not read random loss as
    congestion; in the namespace, linear (not doubling) timeouts for thin streams. The host's
    own settings are left alone: its routes to the namespace are deleted with the veth.
    """
    if not 0 <= loss_percent < 100:
        raise ValueError(f"loss_percent must be in [0, 100), got {loss_percent}")
    tag = f"{os.getpid() % 10_000}{free_port() % 100}"
    ns, host, peer = f"servo-bench-{tag}", f"sbh{tag}", f"sbp{tag}"
    subnet = f"10.{200 + os.getpid() % 50}.{free_port() % 250}"
    in_ns = ("ip", "netns", "exec", ns)
    delayer: subprocess.Popen[str] | None = None
    host_table = ""
    _run("ip", "netns", "add", ns)
    try:
        _run("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
        _run("ip", "link", "set", peer, "netns", ns)
        _run("ip", "addr", "add", f"{subnet}.1/30", "dev", host)
        _run("ip", "link", "set", host, "up")
        _run("ip", "-n", ns, "addr", "add", f"{subnet}.2/30", "dev", peer)
        _run("ip", "-n", ns, "link", "set", peer, "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        if tcp_tuned:
            tuning = ["rto_min", TUNED_RTO_MIN, "congctl", "bbr"]
            _run("ip", "route", "replace", f"{subnet}.0/30", "dev", host, *tuning)
            _run("ip", "-n", ns, "route", "replace", f"{subnet}.0/30", "dev", peer, *tuning)
            _run(*in_ns, "sysctl", "-q", "-w", "net.ipv4.tcp_thin_linear_timeouts=1")
        shape = ["root", "tbf", "rate", f"{rate_mbit}mbit", "burst", "32kbit", "latency", "20ms"]
        _run("tc", "qdisc", "add", "dev", host, *shape)
        _run(*in_ns, "tc", "qdisc", "add", "dev", peer, *shape)
        if loss_percent or delay_ms is not None:
            _run("ip", "link", "set", host, "gso_max_segs", "1")
            _run("ip", "-n", ns, "link", "set", peer, "gso_max_segs", "1")
        if loss_percent:
            _run(*in_ns, "nft", "-f", "-", stdin=_loss_rules(peer, loss_percent))
            _run("nft", "-f", "-", stdin=_loss_rules(host, loss_percent))
            host_table = f"servo_loss_{host}"
        if delay_ms is not None:
            delayer = _start_delayer(in_ns, delay_ms)
            for chain, way, queue in (("INPUT", "-i", INBOUND_QUEUE), ("OUTPUT", "-o", OUTBOUND_QUEUE)):
                _run(*in_ns, "iptables", "-A", chain, way, peer, "-j", "NFQUEUE", "--queue-num", str(queue))
        yield Link(ns, host, f"{subnet}.2", loss_percent, delay_ms)
    finally:
        if delayer is not None:
            stop(delayer, grace_s=5)
            assert delayer.stdout is not None
            delayer.stdout.close()
        if host_table:
            subprocess.run(["nft", "delete", "table", "netdev", host_table], capture_output=True)
        subprocess.run(["ip", "link", "del", host], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _start_delayer(in_ns: tuple[str, ...], delay_ms: tuple[float, float]) -> subprocess.Popen[str]:
    lo, hi = delay_ms
    command = [*in_ns, sys.executable, "-m", "testbed.delay", "--min-ms", str(lo), "--max-ms", str(hi)]
    command += ["--queue", str(INBOUND_QUEUE), "--queue", str(OUTBOUND_QUEUE)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "READY":
        stop(proc, grace_s=5)
        proc.stdout.close()
        raise RuntimeError(f"the delay line did not start (exit {proc.returncode})")
    return proc
