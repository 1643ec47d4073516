"""``servo-monitor``'s settings and its one long-running task: join the fleet, serve the page."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import anyio
import msgspec
from anyio.abc import TaskStatus

from servo.config import FieldError, Port, PositiveInt, doc
from servo.monitor.collector import FleetCollector
from servo.monitor.exporter import FleetExporter
from servo.monitor.fleet import FleetView
from servo.monitor.trust import RobotTrust, load_pins
from servo.monitor.web import MonitorWeb
from servo.transport import DEFAULT_LOCAL_ENDPOINT, TlsSettings, UsrPwdSettings, ZenohSettings, open_zsession


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
        str, doc("File of '<robot> ed25519:<fingerprint>' lines: pinned robot keys (others: trusted on first use).")
    ] = ""
    max_robots: Annotated[PositiveInt, doc("Most robots tracked (further ones are refused and counted).")] = 4096

    def check(self) -> None:
        """Rules that span options; raises `FieldError` naming the option."""
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
    pins = load_pins(config.robot_keys) if config.robot_keys else {}
    view = FleetView(RobotTrust(pins, max_robots=config.max_robots))
    async with open_zsession(config.zenoh_settings()) as zsession, anyio.create_task_group() as tg:
        collector = FleetCollector(view, zsession)
        await tg.start(collector.run)
        web = MonitorWeb(collector, FleetExporter(view))
        port = await tg.start(web.run, config.http_host, config.http_port)
        task_status.started(MonitorReady(port, f"http://{config.http_host}:{port}/"))
