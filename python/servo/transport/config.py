"""Zenoh settings shared by the server manifest and the edge configuration.

Defaults follow what was verified on eclipse-zenoh 1.10.2 (see ZENOH_FACTS): explicit endpoints
everywhere, multicast scouting off, a 1 s lease so a hung peer is noticed in about a second, and
a fast connect retry so a restarted router is rejoined within milliseconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import msgspec
import zenoh

#: Where a server listens when the manifest names no endpoint: loopback only, so an out-of-the-box
#: server never exposes itself on the network.
DEFAULT_LOCAL_ENDPOINT = "tcp/127.0.0.1:7447"

#: How long a DROP publisher waits for room in a link's transmit queue before dropping (µs).
#: Zenoh's default of 1 ms lost the first observation of a freshly opened session in about one
#: session in 30 when the host was CPU-loaded (16 clients + a busy core on 2 vCPUs: 12 first
#: observations lost in 25 rounds at 1 ms, none at 10 ms, measured with benches/_fleet.py) and a
#: lost request costs the robot a whole request timeout. 10 ms still bounds what a put on a dead
#: link can cost its caller.
DROP_WAIT_US = 10_000


class TlsSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """TLS / mTLS files; paths are used as given (relative to the working directory)."""

    root_ca_certificate: str | None = None
    listen_certificate: str | None = None
    listen_private_key: str | None = None
    connect_certificate: str | None = None
    connect_private_key: str | None = None
    enable_mtls: bool = False
    verify_name_on_connect: bool = True


class UsrPwdSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """User/password authentication to a router whose passwords file lists ``user``.

    The password is read from its own file when the session opens, so it never sits in a
    manifest or a command line.
    """

    user: str
    password_file: str


class ZenohSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How one process joins the Zenoh network."""

    mode: Literal["peer", "client", "router"] = "peer"
    listen: list[str] = []
    connect: list[str] = []
    multicast_scouting: bool = False
    lease_ms: int = 1000
    retry_init_ms: int = 100
    retry_max_ms: int = 1000
    shared_memory: bool = True
    tls: TlsSettings | None = None
    auth: UsrPwdSettings | None = None

    def validate(self) -> None:
        """Check endpoints, TLS files and the password file; raises ValueError naming the setting."""
        for field in ("listen", "connect"):
            for endpoint in getattr(self, field):
                proto, sep, addr = endpoint.partition("/")
                if not sep or proto not in {"tcp", "udp", "tls", "quic", "unixsock-stream", "ws"} or not addr:
                    raise ValueError(f"zenoh.{field}: {endpoint!r} is not an endpoint like 'tcp/127.0.0.1:7447'")
        if self.mode == "client" and not self.connect:
            raise ValueError("zenoh.connect: a client must name at least one endpoint to connect to")
        if self.lease_ms < 100:
            raise ValueError(f"zenoh.lease_ms: {self.lease_ms} is below the minimum of 100")
        if self.tls is not None:
            for name in msgspec.structs.asdict(self.tls):
                value = getattr(self.tls, name)
                if isinstance(value, str) and not Path(value).is_file():
                    raise ValueError(f"zenoh.tls.{name}: file {value!r} does not exist")
        if self.auth is not None and not Path(self.auth.password_file).is_file():
            raise ValueError(f"zenoh.auth.password_file: file {self.auth.password_file!r} does not exist")

    def to_config(self) -> zenoh.Config:
        """Build the `zenoh.Config`.

        Every key is set explicitly (zenoh's defaults listen on all interfaces).
        """
        conf = zenoh.Config()
        values: dict[str, Any] = {
            "mode": self.mode,
            "scouting/multicast/enabled": self.multicast_scouting,
            "listen/endpoints": list(self.listen),
            "connect/endpoints": list(self.connect),
            "transport/link/tx/lease": self.lease_ms,
            "transport/shared_memory/enabled": self.shared_memory,
            "transport/link/tx/queue/congestion_control/drop/wait_before_drop": DROP_WAIT_US,
            # Sections whose default is null only accept whole objects (ZENOH_FACTS §0).
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
