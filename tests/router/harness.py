"""A fleet on loopback for the router tests: certificates or passwords, a real router opened from the
fleet file, members joining it in client mode, and inboxes that record what arrives.

Zenoh drops a denied message silently, so "never arrives" is only asserted after a *positive
control*: a message that is allowed, sent after the denied one over the same links at the same
priority or a lower one (zenoh keeps order per priority, and sends higher priorities first), has
arrived. Declarations travel at zenoh's control priority, above all data. Inbox callbacks run on
zenoh's receive thread (``indirect=False``), so arrival order within one session is the order
they are recorded in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Literal

import zenoh
from zenoh.handlers import Callback

from servo.router import Fleet, load_fleet, router_config
from servo.transport import TlsSettings, UsrPwdSettings, ZenohSettings
from servo.wire import ServerKeys
from tests.pki import Leaf, Pki

#: How members prove who they are: a client certificate, a password over plain TCP, or a
#: password over TLS (the router's certificate only).
Auth = Literal["mtls", "usrpwd", "tls-usrpwd"]
WAIT_S = 5.0

#: Identities of the test fleet and their roles.
SERVERS = ["gpu-0"]
KITCHEN_SERVERS = ["gpu-k"]  # limited to app "kitchen"
ROBOTS = ["robot-7", "robot-8"]
MONITORS = ["dashboard"]
ROUTERS = ["router-a", "router-b"]
EVERYONE = [*SERVERS, *KITCHEN_SERVERS, *ROBOTS, *MONITORS, *ROUTERS]


class Inbox:
    """What a zenoh callback received, in arrival order; written by zenoh threads, read by the test."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: list[Any] = []

    def handler(self, convert: Callable[[Any], Any]) -> Callback[Any]:
        """A zenoh handler that records ``convert(item)`` on the receive thread."""
        return Callback(lambda item: self.add(convert(item)), indirect=False)

    def samples(self) -> Callback[Any]:
        """Records ``(key, payload)`` of samples."""
        return self.handler(lambda s: (str(s.key_expr), s.payload.to_bytes()))

    def tokens(self) -> Callback[Any]:
        """Records ``(kind, key)`` of liveliness samples."""
        return self.handler(lambda s: ("put" if s.kind == zenoh.SampleKind.PUT else "delete", str(s.key_expr)))

    def add(self, item: Any) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()

    @property
    def items(self) -> list[Any]:
        with self._cond:
            return list(self._items)

    def wait_for(self, item: Any, timeout: float = WAIT_S) -> list[Any]:
        """Wait until ``item`` was recorded; returns everything recorded so far."""
        with self._cond:
            if not self._cond.wait_for(lambda: item in self._items, timeout):
                raise AssertionError(f"{item!r} never arrived; got {self._items!r}")
            return list(self._items)


def fleet_toml(
    auth: Auth,
    port: int,
    pki: Pki | None,
    passwords: Path | None,
    *,
    name: str = "router-a",
    connect: tuple[str, ...] = (),
    peers: tuple[str, ...] = (),
) -> str:
    """The test fleet file (paths absolute) of router ``name`` listening on ``port``.

    ``connect`` are endpoints of other routers to join, ``peers`` the routers let in.
    """
    scheme = "tcp" if auth == "usrpwd" else "tls"
    router = f"""
listen = ["{scheme}/127.0.0.1:{port}"]
connect = {[f"{scheme}/{c}" for c in connect]}
"""
    if auth != "mtls":
        router += f'passwords_file = "{passwords}"\n'
    if auth != "usrpwd":
        assert pki is not None
        leaf = Path(pki.directory) / name
        router += f"""
[router.tls]
certificate = "{leaf}.pem"
private_key = "{leaf}.key"
root_ca = "{pki.ca}"
mtls = {str(auth == "mtls").lower()}
"""
    routers = f"[[routers]]\nnames = {list(peers)}" if peers else ""
    return f"""
[router]
{router}
[[servers]]
names = {SERVERS}
[[servers]]
names = {KITCHEN_SERVERS}
apps = ["kitchen"]
[[robots]]
names = {ROBOTS}
[[monitors]]
names = {MONITORS}
data = true
{routers}
"""


class Credentials:
    """How each identity proves who it is: its certificate, or its password."""

    def __init__(self, tmp: Path) -> None:
        self.pki = Pki(tmp / "pki")
        self.leaves: dict[str, Leaf] = {
            name: self.pki.issue(name, ip="127.0.0.1" if name in ROUTERS else None) for name in EVERYONE
        }
        self.passwords = tmp / "passwords.txt"
        self.passwords.write_text("".join(f"{name}:pw-of-{name}\n" for name in EVERYONE))
        self.secrets = {name: tmp / f"{name}.secret" for name in EVERYONE}  # what each member holds
        for name, path in self.secrets.items():
            path.write_text(f"pw-of-{name}\n")

    def mtls(self, name: str, port: int) -> ZenohSettings:
        """Client-mode settings of ``name`` joining the router on ``port`` with its certificate."""
        leaf = self.leaves[name]
        tls = TlsSettings(
            root_ca_certificate=self.pki.ca,
            connect_certificate=leaf.cert,
            connect_private_key=leaf.key,
            enable_mtls=True,
        )
        return ZenohSettings(mode="client", connect=[f"tls/127.0.0.1:{port}"], tls=tls)

    def settings(self, auth: Auth, name: str, port: int) -> zenoh.Config:
        """Client-mode config of ``name`` joining the router on ``port``."""
        if auth == "mtls":
            return self.mtls(name, port).to_config()
        password = UsrPwdSettings(name, str(self.secrets[name]))
        if auth == "usrpwd":
            return ZenohSettings(mode="client", connect=[f"tcp/127.0.0.1:{port}"], auth=password).to_config()
        tls = TlsSettings(root_ca_certificate=self.pki.ca)
        return ZenohSettings(mode="client", connect=[f"tls/127.0.0.1:{port}"], tls=tls, auth=password).to_config()


class Net:
    """One router and the members that joined it; every session is closed by `close`."""

    def __init__(self, auth: Auth, creds: Credentials, fleet_file: Path, port: int) -> None:
        self.auth, self.creds, self.port = auth, creds, port
        self.fleet: Fleet = load_fleet(fleet_file)
        self._stack = ExitStack()
        self._tokens: list[zenoh.LivelinessToken] = []
        self._watched: Inbox | None = None
        self.router = self._stack.enter_context(zenoh.open(router_config(self.fleet)))

    def join(self, name: str) -> zenoh.Session:
        """A client-mode session of ``name``."""
        return self._stack.enter_context(zenoh.open(self.creds.settings(self.auth, name, self.port)))

    def token(self, z: zenoh.Session, key: str) -> None:
        """Declare a liveliness token that lives until `close` (a dropped token is undeclared)."""
        self._tokens.append(z.liveliness().declare_token(key))

    def wait_token(self, key: str) -> None:
        """Wait until the router knows the liveliness token ``key`` (a monitor sees it).

        Declarations reach the router asynchronously: a member that queries right after another
        declared could otherwise race the declaration.
        """
        if self._watched is None:
            self._watched = Inbox()
            watcher = self.join("dashboard")
            for selector in ("@servo/*/*/*/alive", "@servo/*/*/*/c/*/alive"):
                watcher.liveliness().declare_subscriber(selector, self._watched.tokens(), history=True)
        self._watched.wait_for(("put", key))

    def close(self) -> None:
        self._tokens.clear()
        self._stack.close()


class FakeServer:
    """The zenoh surface of a policy server on ``keys``: what servo-serve declares, nothing more.

    Records observations, queries and client tokens; answers every query on its own key.
    """

    def __init__(self, z: zenoh.Session, keys: ServerKeys) -> None:
        self.z, self.keys = z, keys
        self.obs, self.queries, self.clients = Inbox(), Inbox(), Inbox()
        self.entities: list[Any] = [
            z.declare_subscriber(keys.all_obs, self.obs.samples()),
            z.liveliness().declare_subscriber(keys.all_client_alive, self.clients.tokens(), history=True),
        ]
        for key in (keys.status, keys.trajectory, keys.audit, keys.all_sessions, keys.all_control):
            self.entities.append(z.declare_queryable(key, Callback(self._answer, indirect=False)))
        self.entities.append(z.liveliness().declare_token(keys.alive))

    def _answer(self, query: zenoh.Query) -> None:
        key = str(query.key_expr)
        self.queries.add(key)
        # Like servo-serve: discovery selectors are wildcards, replies go out on our own key.
        reply_key = key if "/c/" in key else f"{self.keys.prefix}/{key.rsplit('/', 1)[1]}"
        query.reply(reply_key, self.keys.replica.encode())
        query.drop()


def obs_publisher(z: zenoh.Session, key: str) -> zenoh.Publisher:
    """A publisher at the observations' priority (the order the router keeps is per priority).

    It blocks instead of dropping: a positive control lost to a busy host would fail the test
    for the wrong reason.
    """
    return z.declare_publisher(key, priority=zenoh.Priority.DATA, congestion_control=zenoh.CongestionControl.BLOCK)


def action_publisher(z: zenoh.Session, key: str) -> zenoh.Publisher:
    """A publisher at the action chunks' priority (see `obs_publisher`)."""
    return z.declare_publisher(
        key, priority=zenoh.Priority.INTERACTIVE_HIGH, express=True, congestion_control=zenoh.CongestionControl.BLOCK
    )


def replies(z: zenoh.Session, selector: str) -> list[tuple[str, bytes]]:
    """``(key, payload)`` of the ok replies to a query (an empty list when nobody was reached)."""
    out = []
    for reply in z.get(selector, timeout=WAIT_S):
        if reply.ok is not None:
            out.append((str(reply.ok.key_expr), reply.ok.payload.to_bytes()))
    return out


def tokens(z: zenoh.Session, selector: str) -> list[str]:
    """Keys of the liveliness tokens a liveliness query finds."""
    return sorted({str(r.ok.key_expr) for r in z.liveliness().get(selector, timeout=WAIT_S) if r.ok is not None})


def wait_matching(publisher: zenoh.Publisher) -> None:
    """Wait until ``publisher`` knows a subscriber (a put before that is dropped by the sender)."""
    matched = threading.Event()
    listener = publisher.declare_matching_listener(Callback(lambda s: s.matching and matched.set(), indirect=False))
    try:
        if not (publisher.matching_status.matching or matched.wait(WAIT_S)):
            raise AssertionError(f"no subscriber matched {publisher.key_expr}")
    finally:
        listener.undeclare()  # type: ignore[no-untyped-call]
