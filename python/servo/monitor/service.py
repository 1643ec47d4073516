"""``servo-monitor``'s settings and its one long-running task: join the fleet, serve the page."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import anyio
import msgspec
from anyio.abc import TaskStatus

from servo.config import FieldError, Port, PositiveInt, doc
from servo.home import ensure_config_dir, monitor_state_path
from servo.identity import Identity, operator_identity
from servo.logs import get_logger
from servo.monitor.collector import FleetCollector
from servo.monitor.exporter import FleetExporter
from servo.monitor.fleet import FleetView
from servo.monitor.trust import RobotTrust, load_pins
from servo.monitor.web import MonitorWeb
from servo.router.fleet import identities
from servo.transport import DEFAULT_LOCAL_ENDPOINT, TlsSettings, UsrPwdSettings, ZenohSettings, open_zsession
from servo.wire import WireError, parse_fingerprint

log = get_logger(__name__)


class MonitorConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What ``servo-monitor`` needs (every field is also a flag, ``--http-port``)."""

    connect: Annotated[list[str], doc("Zenoh endpoint(s) of the router (or server) to join.")] = msgspec.field(
        default_factory=lambda: [DEFAULT_LOCAL_ENDPOINT]
    )
    tls_root_ca: Annotated[str, doc("TLS: CA certificate trusted for the router.")] = ""
    tls_cert: Annotated[str, doc("mTLS: this monitor's certificate (its CN is a [[monitors]] name).")] = ""
    tls_key: Annotated[str, doc("mTLS: this monitor's private key.")] = ""
    auth_user: Annotated[str, doc("User/password fleets: this monitor's user name.")] = ""
    auth_password_file: Annotated[str, doc("User/password fleets: a file holding only this monitor's password.")] = ""
    http_host: Annotated[str, doc("Address the page listens on (read-only; keep it local unless needed).")] = (
        "127.0.0.1"
    )
    http_port: Annotated[Port, doc("Port of the page, its JSON and /metrics; 0 picks a free one.")] = 9200
    robot_keys: Annotated[
        str, doc("File of '<robot> ed25519:<fingerprint>' lines: robots' telemetry keys (besides the fleet's).")
    ] = ""
    trusted_servers: Annotated[
        list[str], doc("Server identities (ed25519:…, printed by servo-serve) whose replicas this monitor believes.")
    ] = []
    fleet: Annotated[
        str, doc("A fleet file: its [[servers]] and [[robots]] identities are trusted (servo-router's).")
    ] = ""
    identity_key: Annotated[
        str,
        doc(
            "This monitor's operator identity (servers list it in [security] operators); monitor.key in servo's "
            "directory when empty."
        ),
    ] = ""
    state_file: Annotated[
        str, doc("The telemetry runs seen, kept across restarts; monitor.state in servo's directory when empty.")
    ] = ""
    trust_first_use: Annotated[
        bool,
        doc(
            "Believe the first key of a robot nobody enrolled and the first identity of a replica nobody pinned "
            "(anyone who speaks first is believed: for a trial on a trusted network only)."
        ),
    ] = False
    max_robots: Annotated[PositiveInt, doc("Most robots trusted on first use (enrolled ones always have a place).")] = (
        4096
    )

    def check(self) -> None:
        """Rules that span options; raises `FieldError` naming the option."""
        for i, text in enumerate(self.trusted_servers):
            try:
                parse_fingerprint(text)
            except WireError as exc:
                raise FieldError(f"trusted_servers[{i}]", str(exc)) from None
        if bool(self.tls_cert) != bool(self.tls_key):
            raise FieldError("tls_cert" if self.tls_key else "tls_key", "mTLS needs both tls_cert and tls_key")
        if bool(self.auth_user) != bool(self.auth_password_file):
            raise FieldError("auth_user", "user/password authentication needs both auth_user and auth_password_file")
        self.zenoh_settings().check()

    def zenoh_settings(self) -> ZenohSettings:
        """A client of the router, like every fleet member."""
        tls = None
        if self.tls_root_ca or self.tls_cert:
            tls = TlsSettings(
                root_ca_certificate=self.tls_root_ca or None,
                connect_certificate=self.tls_cert or None,
                connect_private_key=self.tls_key or None,
                enable_mtls=bool(self.tls_cert),
            )
        auth = UsrPwdSettings(self.auth_user, self.auth_password_file) if self.auth_user else None
        return ZenohSettings(mode="client", connect=list(self.connect), tls=tls, auth=auth)


@dataclass(frozen=True)
class MonitorReady:
    """What `run_monitor` reports once it serves."""

    http_port: int
    url: str


async def run_monitor(
    config: MonitorConfig, *, task_status: TaskStatus[MonitorReady] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Join the fleet, serve the page until cancelled.

    Raises:
        TrustError: the robot keys file cannot be used.
        zenoh.ZError: nothing to join at ``connect``.
        OSError: the page's port cannot be bound.
    """
    trust, identity = await anyio.to_thread.run_sync(monitor_trust, config)
    view = FleetView(trust, identity)
    try:
        async with open_zsession(config.zenoh_settings()) as zsession, anyio.create_task_group() as tg:
            collector = FleetCollector(view, zsession, identity)
            await tg.start(collector.run)
            web = MonitorWeb(collector, FleetExporter(view))
            port = await tg.start(web.run, config.http_host, config.http_port)
            task_status.started(MonitorReady(port, f"http://{config.http_host}:{port}/"))
    finally:
        trust.save()


def monitor_trust(config: MonitorConfig) -> tuple[RobotTrust, Identity]:
    """Whom ``config`` trusts and who the monitor is (reads files: off the event loop).

    Raises:
        TrustError: the robot keys or state file cannot be used.
        ConfigError: the fleet file cannot be used.
        IdentityError: the monitor's identity cannot be read or created.
    """
    pins = load_pins(config.robot_keys) if config.robot_keys else {}
    servers = {parse_fingerprint(text) for text in config.trusted_servers}
    if config.fleet:
        pins = {**identities(config.fleet, "robots"), **pins}
        servers |= set(identities(config.fleet, "servers").values())
    if config.trust_first_use:
        log.warning("trusting first use: the first key a robot or replica shows is believed, whoever shows it")
    if not config.state_file:
        ensure_config_dir()
    trust = RobotTrust(
        pins,
        servers=frozenset(servers),
        max_robots=config.max_robots,
        trust_first_use=config.trust_first_use,
        state=Path(config.state_file) if config.state_file else monitor_state_path(),
    )
    return trust, operator_identity(config.identity_key)
