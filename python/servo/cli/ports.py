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

from servo.errors import StartError

#: Zenoh link protocols whose endpoints bind a UDP port; the other IP ones bind TCP.
_UDP_PROTOCOLS = frozenset({"udp", "quic"})
_IP_PROTOCOLS = frozenset({"tcp", "tls", "ws"}) | _UDP_PROTOCOLS


class BusyPort(NamedTuple):
    """A port a server was about to listen on, held by another socket, and a free one nearby."""

    setting: str  # the manifest key that chose it: zenoh.listen, ops.health_port, frontends.openpi.listen
    shown: str  # the key as the message names it: "zenoh.listen tcp/127.0.0.1:7447"
    value: str  # its value there: the endpoint, the port, host:port
    port: int
    free: int | None  # the next port above it that is free now (None: none within reach)


class PortInUseError(StartError, OSError):
    """Ports the server is about to listen on are held by other sockets (`busy`, in order)."""

    def __init__(self, busy: list[BusyPort]) -> None:
        shown = [f"{p.port} ({p.shown})" for p in busy]
        subject = f"port {shown[0]} is" if len(shown) == 1 else f"ports {', '.join(shown[:-1])} and {shown[-1]} are"
        super().__init__(f"{subject} already in use")
        self.busy = busy


class _Port(NamedTuple):
    setting: str
    shown: str
    value: str
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
            ``port 7447 (zenoh.listen tcp/127.0.0.1:7447) is already in use``; its ``busy`` says
            which, with a free port near each.
    """
    ports = [port for port in map(_zenoh_port, listen) if port is not None]
    if health_port:
        shown = f"ops.health_port on {health_host}"
        ports.append(_Port("ops.health_port", shown, str(health_port), health_host, health_port, udp=False))
    ports += [
        _Port(setting, f"{setting} on {host}", f"{host}:{port}", host, port, udp=False)
        for setting, host, port in others
        if port
    ]
    busy = [BusyPort(p.setting, p.shown, p.value, p.port, _free_near(p)) for p in ports if _in_use(p)]
    if busy:
        raise PortInUseError(busy)


def free_ports_advice(error: PortInUseError, flags: dict[str, str]) -> str:
    """The flags that move every busy port to a free one: ``--listen tcp/127.0.0.1:7448 --health-port 9101``.

    ``flags`` maps a setting to the flag that sets it (``{"ops.health_port": "--health-port"}``);
    a listen endpoint is given whole, with the free port in place. Settings without a flag, or
    ports with no free one near, are left out.
    """
    parts = []
    for busy in error.busy:
        flag = flags.get(busy.setting)
        if flag is None or busy.free is None:
            continue
        # A port alone, host:port or an endpoint (with ?metadata#config): the same, the free port in place.
        address = busy.value.split("?", 1)[0].split("#", 1)[0]
        head, colon, _ = address.rpartition(":")
        parts.append(f"{flag} {head}{colon}{busy.free}{busy.value[len(address) :]}")
    return " ".join(parts)


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
    return _Port("zenoh.listen", f"zenoh.listen {endpoint}", endpoint, host, int(port), protocol in _UDP_PROTOCOLS)


def _free_near(port: _Port, reach: int = 64) -> int | None:
    """The first port above ``port`` (within ``reach``) that nothing holds now."""
    for candidate in range(port.port + 1, min(port.port + 1 + reach, 65536)):
        if not _in_use(port._replace(port=candidate)):
            return candidate
    return None


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
