"""Zenoh settings shared by the server manifest and the edge configuration.

Defaults follow what was verified on eclipse-zenoh 1.10.2 (docs/design/zenoh.md): explicit endpoints
everywhere, multicast scouting off, a 1 s lease so a hung peer is noticed in about a second, and
a fast connect retry so a restarted router is rejoined within milliseconds.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import zenoh

from servo.config import FieldError, LeaseMs, NonEmptyStr, PositiveInt, doc

#: Where a server listens when the manifest names no endpoint: loopback only, so an out-of-the-box
#: server never exposes itself on the network.
DEFAULT_LOCAL_ENDPOINT = "tcp/127.0.0.1:7447"
#: The lease servers and robots announce (ms): a frozen peer (SIGSTOP, power or cable cut) is
#: noticed after it; a killed one on a reachable host when its sockets close, whatever the lease.
#: 1 s let a healthy robot's link expire at load 20-36 on 2 cores (its process sent nothing for a
#: second): 15 false losses in 60 robot-minutes; 3 s: none in 25 (benches/results/liveliness.md).
DEFAULT_LEASE_MS = 3000

#: How long a DROP publisher waits for room in a link's transmit queue before dropping (µs).
#: Zenoh's default of 1 ms lost the first observation of a freshly opened session in about one
#: session in 30 when the host was CPU-loaded (16 clients + a busy core on 2 vCPUs: 12 first
#: observations lost in 25 rounds at 1 ms, none at 10 ms, measured with benches/_fleet.py) and a
#: lost request costs the robot a whole request timeout. 10 ms still bounds what a put on a dead
#: link can cost its caller.
DROP_WAIT_US = 10_000
#: Batches (64 KiB each) in a link's transmit queue at the observations' priority (Zenoh's
#: default is 4, its maximum 16). A raw 2x480x640 observation is 29 batches: with 4, ``put``
#: waited for the socket to drain most of it (2.1 ms p50 on loopback); with 16 it returned in
#: 1.0-1.1 ms and the round trip fell from 2.8 to 1.7-2.1 ms (bare zenoh, SHM off, 1.84 MB ping
#: with a 1.3 kB echo; benches/results/link.md).
DATA_QUEUE_BATCHES = 16
#: Links a listener holds in their handshake at once (Zenoh's ``transport/unicast/accept_pending``).
#: Zenoh's default of 100 let a stranger lock every new robot out of a server by holding 101
#: connections open after their TLS handshake, sending nothing (measured: a robot's dial then
#: timed out; one connection fewer, it linked in 25 ms). A pending link costs a socket and a
#: task; 1024 of them, freed every `ACCEPT_TIMEOUT_MS`, make the lock-out cost the stranger ~200
#: TLS handshakes a second instead of 10. Beyond a bound servo cannot see who holds them: mTLS
#: or a firewall does (docs/guides/security.md).
ACCEPT_PENDING = 1024
#: How long a listener waits for a link's Zenoh handshake (ms; Zenoh's default 10 s): two round
#: trips of a few hundred bytes, with room for several retransmissions each on a lossy link.
ACCEPT_TIMEOUT_MS = 5000
#: Zenoh's own limit on opening one link (its ``transport/unicast/open_timeout``, ms).
OPEN_TIMEOUT_MS = 10_000
#: ...when a quic/ endpoint is dialled before tls/ (ms): a QUIC handshake nobody answers (nothing
#: listens on UDP, or a firewall drops it) ends only by this timeout, and then TLS is dialled. It
#: leaves a lossy link time for a few lost handshake packets (QUIC's first probe waits ~1 s).
QUIC_OPEN_TIMEOUT_MS = 4000


_PROTOCOLS = ("tcp", "udp", "tls", "quic", "unixsock-stream", "ws")
#: Protocols whose traffic is encrypted (and authenticated by certificate) on the wire.
_ENCRYPTED = ("tls", "quic")
#: Protocols that never leave the host.
_LOCAL = ("unixsock-stream",)


def loopback_host(host: str) -> bool:
    """Whether ``host`` (an address or name, brackets allowed) never leaves this machine."""
    host = host.strip("[]").split("%")[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def off_loopback(endpoint: str) -> bool:
    """Whether ``endpoint`` reaches, or is reachable from, other hosts (any protocol but Unix sockets).

    A wildcard listen (``tls/0.0.0.0:7447``, ``tcp/[::]:7447``) and a host name other than
    ``localhost`` count as off loopback.
    """
    proto, _, address = endpoint.partition("/")
    if proto in _LOCAL:
        return False
    return not loopback_host(address.split("?")[0].split("#")[0].rpartition(":")[0])


def exposed_endpoint(endpoint: str) -> bool:
    """Whether ``endpoint`` carries plain text to or from other hosts.

    True for ``tcp/``, ``udp/`` and ``ws/`` on any address but a loopback one (127.0.0.0/8,
    ``::1``, ``localhost``); False for ``tls/``, ``quic/`` and Unix sockets. A host name other
    than ``localhost`` counts as another host (it may resolve anywhere).
    """
    proto = endpoint.partition("/")[0]
    return proto not in _ENCRYPTED and off_loopback(endpoint)


def quic_beside(endpoints: list[str]) -> list[str]:
    """A ``quic/`` endpoint at the address of each ``tls/`` one in ``endpoints`` (nothing else).

    QUIC is TLS 1.3 over UDP: Zenoh takes its certificates, CA and name check from the same
    ``transport/link/tls`` settings as ``tls/``, so the pair is equally authenticated; only the
    transport under the encryption differs. A ``tcp/`` (plain) endpoint never gets one: there is
    no certificate to check a QUIC peer against.
    """
    return ["quic/" + e.partition("/")[2] for e in endpoints if e.startswith("tls/")]


def quic_first(settings: ZenohSettings) -> ZenohSettings:
    """``settings`` dialling ``quic/`` at each ``tls/`` endpoint's address before the endpoints given.

    A Zenoh client dials its endpoints in order and keeps the first link that opens, on every
    (re)connect; a QUIC dial nobody answers ends after `QUIC_OPEN_TIMEOUT_MS`. Only a client
    changes: a peer would link over every endpoint at once.
    """
    quic = quic_beside(list(settings.connect))
    if settings.mode != "client" or not quic:
        return settings
    return msgspec.structs.replace(settings, connect=[*quic, *settings.connect], open_timeout_ms=QUIC_OPEN_TIMEOUT_MS)


class TlsSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """TLS / mTLS files; paths are used as given (relative to the working directory)."""

    root_ca_certificate: Annotated[str | None, doc("CA certificate that signs the peers' certificates.")] = None
    listen_certificate: Annotated[str | None, doc("Certificate presented to connecting peers.")] = None
    listen_private_key: Annotated[str | None, doc("Private key of listen_certificate.")] = None
    connect_certificate: Annotated[str | None, doc("Certificate presented when connecting (mTLS).")] = None
    connect_private_key: Annotated[str | None, doc("Private key of connect_certificate.")] = None
    enable_mtls: Annotated[bool, doc("Require a certificate from both sides.")] = False
    verify_name_on_connect: Annotated[bool, doc("Check that the peer's certificate names the host connected to.")] = (
        True
    )

    def check(self) -> None:
        """Every named file must exist (a typo fails here, not as zenoh's generic connect error)."""
        for name in msgspec.structs.asdict(self):
            value = getattr(self, name)
            if isinstance(value, str) and not Path(value).is_file():
                raise FieldError(name, "file does not exist")


class UsrPwdSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """User/password authentication to a router whose passwords file lists ``user``.

    The password is read from its own file when the session opens, so it never sits in a
    manifest or a command line.
    """

    user: Annotated[NonEmptyStr, doc("User name listed in the router's passwords file.")]
    password_file: Annotated[str, doc("File holding this user's password (one line).")]

    def check(self) -> None:
        """The password file must exist (it is read when the session opens)."""
        if not Path(self.password_file).is_file():
            raise FieldError("password_file", "file does not exist")


class ZenohSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How one process joins the Zenoh network."""

    mode: Annotated[
        Literal["peer", "client", "router"],
        doc("peer (listens and connects), client (connects to a router or peer) or router."),
    ] = "peer"
    listen: Annotated[list[str], doc("Endpoints to listen on, e.g. tcp/127.0.0.1:7447.")] = []
    connect: Annotated[list[str], doc("Endpoints to connect to.")] = []
    multicast_scouting: Annotated[bool, doc("Find peers by multicast (off: explicit endpoints).")] = False
    lease_ms: Annotated[LeaseMs, doc("Lease announced to peers: how fast this process's freeze is noticed (ms).")] = (
        DEFAULT_LEASE_MS
    )
    retry_init_ms: Annotated[PositiveInt, doc("First reconnect delay of a lost link (ms).")] = 100
    retry_max_ms: Annotated[PositiveInt, doc("Largest reconnect delay of a lost link (ms).")] = 1000
    shared_memory: Annotated[bool, doc("Move big payloads through /dev/shm between processes of one host.")] = True
    quic_beside_tls: Annotated[
        bool,
        doc(
            "Also listen on quic/ (UDP, same port and certificate) beside each tls/ listen endpoint: robots "
            "on a lossy link use it first (docs/guides/bad-links.md)."
        ),
    ] = True
    open_timeout_ms: Annotated[
        PositiveInt, doc("How long opening one link may take before the next is tried (ms).")
    ] = OPEN_TIMEOUT_MS
    tls: TlsSettings | None = None
    auth: UsrPwdSettings | None = None

    def check(self) -> None:
        """Endpoint syntax and mode rules (raises `FieldError` naming the setting)."""
        for field in ("listen", "connect"):
            for i, endpoint in enumerate(getattr(self, field)):
                proto, sep, addr = endpoint.partition("/")
                if not sep or proto not in _PROTOCOLS or not addr:
                    raise FieldError(f"{field}[{i}]", "not an endpoint like 'tcp/127.0.0.1:7447'")
        if self.mode == "client" and not self.connect:
            raise FieldError("connect", "a client must name at least one endpoint to connect to")

    def listen_endpoints(self) -> list[str]:
        """Where this process listens: ``listen``, and a ``quic/`` beside each ``tls/`` one if `quic_beside_tls`."""
        extra = [e for e in quic_beside(list(self.listen)) if e not in self.listen] if self.quic_beside_tls else []
        return [*self.listen, *extra]

    def to_config(self) -> zenoh.Config:
        """Build the `zenoh.Config`.

        Every key is set explicitly (zenoh's defaults listen on all interfaces).
        """
        conf = zenoh.Config()
        values: dict[str, Any] = {
            "mode": self.mode,
            "scouting/multicast/enabled": self.multicast_scouting,
            "listen/endpoints": self.listen_endpoints(),
            "connect/endpoints": list(self.connect),
            "transport/link/tx/lease": self.lease_ms,
            "transport/shared_memory/enabled": self.shared_memory,
            "transport/link/tx/queue/congestion_control/drop/wait_before_drop": DROP_WAIT_US,
            "transport/link/tx/queue/size/data": DATA_QUEUE_BATCHES,
            "transport/unicast/open_timeout": self.open_timeout_ms,
            "transport/unicast/accept_pending": ACCEPT_PENDING,
            "transport/unicast/accept_timeout": ACCEPT_TIMEOUT_MS,
            # Sections whose default is null only accept whole objects (docs/design/zenoh.md §1).
            "connect/retry": {
                "period_init_ms": self.retry_init_ms,
                "period_max_ms": self.retry_max_ms,
                "period_increase_factor": 2,
            },
        }
        if self.tls is not None:
            for name, value in msgspec.structs.asdict(self.tls).items():
                if value is not None:
                    values[f"transport/link/tls/{name}"] = value
        if self.auth is not None:
            values["transport/auth/usrpwd/user"] = self.auth.user
            values["transport/auth/usrpwd/password"] = Path(self.auth.password_file).read_text().strip()
        for key, value in values.items():
            conf.insert_json5(key, json.dumps(value))
        return conf
