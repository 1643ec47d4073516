"""Refuse a policy server's busy listening ports at start-up, in one line that names them.

A server loads and warms its model (minutes for a large one) before Zenoh binds its listen
endpoints, and the operating system's own error does not say which port it means. Checking
first makes a busy port fail within a second, by number and by the setting that chose it,
before anything is loaded. The check can race with another process binding the port a moment
later; the bind itself still fails then, only later and less clearly.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable
from typing import NamedTuple

#: Zenoh link protocols whose endpoints bind a UDP port; the other IP ones bind TCP.
_UDP_PROTOCOLS = frozenset({"udp", "quic"})
_IP_PROTOCOLS = frozenset({"tcp", "tls", "ws"}) | _UDP_PROTOCOLS


class PortInUseError(OSError):
    """A port the server is about to listen on is held by another socket."""


class _Port(NamedTuple):
    setting: str  # what chose the port, as the user wrote it: "zenoh.listen tcp/127.0.0.1:7447"
    host: str
    port: int
    udp: bool


def refuse_busy(
    listen: Iterable[str], health_host: str, health_port: int, *, others: Iterable[tuple[str, str, int]] = ()
) -> None:
    """Raise if a port of a server about to start is held by another socket right now.

    Args:
        listen: Zenoh listen endpoints (``tcp/127.0.0.1:7447``), assumed valid
            (``ZenohSettings.validate``). Port 0 and Unix sockets cannot collide and are skipped.
        health_host: Address of the health/metrics endpoint.
        health_port: Its port; 0 (disabled) is skipped.
        others: More TCP ports as ``(setting, host, port)``, e.g. a frontend's; port 0 is skipped.

    Raises:
        PortInUseError: One line naming every busy port and the setting that chose it, e.g.
            ``port 7447 (zenoh.listen tcp/127.0.0.1:7447) is already in use``.
    """
    ports = [port for port in map(_zenoh_port, listen) if port is not None]
    if health_port:
        ports.append(_Port(f"ops.health_port on {health_host}", health_host, health_port, udp=False))
    ports += [_Port(f"{setting} on {host}", host, port, udp=False) for setting, host, port in others if port]
    busy = [f"{p.port} ({p.setting})" for p in ports if _in_use(p)]
    if busy:
        subject = f"port {busy[0]} is" if len(busy) == 1 else f"ports {', '.join(busy[:-1])} and {busy[-1]} are"
        raise PortInUseError(f"{subject} already in use")


def split_endpoint(endpoint: str) -> tuple[str, str, str]:
    """``tls/[::1]:7447?x#y`` -> ``("tls", "::1", "7447")``: protocol, host (no brackets) and port text."""
    protocol, _, address = endpoint.partition("/")
    # Zenoh endpoints may carry ?metadata and #configuration after the address.
    host, _, port = address.split("?", 1)[0].split("#", 1)[0].rpartition(":")
    return protocol, host.strip("[]"), port


def _zenoh_port(endpoint: str) -> _Port | None:
    protocol, host, port = split_endpoint(endpoint)
    if protocol not in _IP_PROTOCOLS or not port.isdigit() or int(port) == 0:
        return None
    return _Port(f"zenoh.listen {endpoint}", host, int(port), protocol in _UDP_PROTOCOLS)


def _in_use(port: _Port) -> bool:
    kind = socket.SOCK_DGRAM if port.udp else socket.SOCK_STREAM
    try:
        addresses = socket.getaddrinfo(port.host or None, port.port, type=kind, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return False  # an unresolvable host is the bind's own error to report
    family, _, _, _, address = addresses[0]
    with socket.socket(family, kind) as probe:
        if not port.udp:
            # Servers listen with SO_REUSEADDR, so the closing connections (TIME_WAIT) a stopped
            # server leaves on its port do not stop its successor; without it they would look busy.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False
