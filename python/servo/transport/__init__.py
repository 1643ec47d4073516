"""Zenoh plumbing shared by the server and the client: settings, Zenoh sessions, QoS, queries."""

from servo.transport.bridge import direct, query
from servo.transport.certificate import CertificateError, common_name
from servo.transport.config import (
    DEFAULT_LEASE_MS,
    DEFAULT_LOCAL_ENDPOINT,
    TlsSettings,
    UsrPwdSettings,
    ZenohSettings,
    exposed_endpoint,
    loopback_host,
    off_loopback,
    quic_beside,
    quic_first,
)
from servo.transport.qos import declare_action_publisher, declare_obs_publisher
from servo.transport.zsession import Declared, open_zsession, zenoh_message

__all__ = [
    "DEFAULT_LEASE_MS",
    "DEFAULT_LOCAL_ENDPOINT",
    "CertificateError",
    "Declared",
    "TlsSettings",
    "UsrPwdSettings",
    "ZenohSettings",
    "common_name",
    "declare_action_publisher",
    "declare_obs_publisher",
    "direct",
    "exposed_endpoint",
    "loopback_host",
    "off_loopback",
    "open_zsession",
    "query",
    "quic_beside",
    "quic_first",
    "zenoh_message",
]
