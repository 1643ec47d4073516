"""``servo-serve`` on the network, securely without setting up certificates.

A ``tls/…`` or ``quic/…`` listen endpoint (QUIC is TLS over UDP: the link for lossy radio links,
README *Bad links*) with no certificate in the manifest (``[zenoh.tls]
listen_certificate``) gets servo's own self-signed one (`servo.server.selfsigned`), kept in
``tls/`` of servo's user configuration directory and made once; so does an openpi door off
loopback without ``--insecure`` (``wss://``). ``servo-serve`` then prints the ``servo-edge``
commands that reach it: with a join token (`servo.join`) that pins the certificate, the robot
fetches it itself; otherwise the robot's copy of the certificate goes to ``--tls-root-ca``. A
fleet with its own CA configures ``[zenoh.tls]`` instead (docs/guides/fleet.md, *Certificates*).
"""

from __future__ import annotations

import ipaddress
import shlex
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from msgspec.structs import replace

from servo.cli.ports import split_endpoint
from servo.home import config_dir, ensure_config_dir
from servo.join import JoinToken
from servo.robots.builtin import SimOptions
from servo.robots.calibration import NormMode
from servo.server.manifest import Manifest
from servo.transport import TlsSettings, exposed_endpoint, loopback_host

if TYPE_CHECKING:
    from servo.server.selfsigned import ServerCertificate

#: Listen hosts that mean every interface: an edge dials one of this host's addresses instead.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
#: Protocols whose listen needs a certificate (Zenoh reads both from ``transport/link/tls``).
ENCRYPTED_PROTOCOLS = ("tls", "quic")
#: The control rate every built-in robot runs at unless told (``--robot-opt fps=``).
DEFAULT_FPS = SimOptions().fps


def certificate_dir() -> Path:
    """Where the self-signed server certificate and its key live."""
    return config_dir() / "tls"


def secure_listen(manifest: Manifest) -> tuple[Manifest, ServerCertificate | None]:
    """The manifest with the self-signed certificate in place when a TLS listen has none.

    Raises:
        OSError: the certificate directory or files cannot be written or read.
        CertificateFileError: the key on disk is unusable (named).
    """
    z, openpi = manifest.zenoh, manifest.frontends.openpi
    hosts = [host for protocol, host, _ in map(split_endpoint, z.listen) if protocol in ENCRYPTED_PROTOCOLS]
    zenoh_needs = bool(hosts) and not (z.tls is not None and z.tls.listen_certificate)
    openpi_needs = (
        openpi is not None
        and not openpi.certificate
        and not loopback_host(openpi.host)
        and not manifest.security.insecure
    )
    if not (zenoh_needs or openpi_needs):
        return manifest, None
    from servo.server.selfsigned import ensure_certificate  # cryptography: the server extra

    ensure_config_dir()
    door_hosts = [openpi.host] if openpi is not None and openpi_needs else []
    certificate = ensure_certificate(certificate_dir(), hosts=[*hosts, *door_hosts])
    if zenoh_needs:
        files = {"listen_certificate": str(certificate.cert), "listen_private_key": str(certificate.key)}
        manifest = replace(manifest, zenoh=replace(z, tls=replace(z.tls or TlsSettings(), **files)))
    if openpi_needs:
        assert openpi is not None
        door = replace(openpi, certificate=str(certificate.cert), private_key=str(certificate.key))
        manifest = replace(manifest, frontends=replace(manifest.frontends, openpi=door))
    return manifest, certificate


def edge_command(
    endpoint: str,
    *,
    robot: str,
    certificate: ServerCertificate | None,
    fps: float | None = None,
    buffer_time_s: float | None = None,
    options: Mapping[str, str] | None = None,
    join: str = "",
    client_id: str = "",
) -> str | None:
    """The ``servo-edge`` command that reaches a server listening on ``endpoint`` (None if unknown).

    Every command ``servo-serve`` prints is built here, from what the robot needs to match the
    policy: its ``--robot-opt`` ``options``, the policy's rate (``fps``, added as ``--robot-opt
    fps=`` when it is not the robots' default and the options do not set it) and the edge buffer
    the capacity plan asks for (``buffer_time_s``). A TLS or QUIC endpoint is described only with
    servo's self-signed certificate: a ``join`` token pins it (the edge fetches it), else the edge trusts
    its copy, named like the original. A wildcard host becomes this host's primary address.
    ``client_id`` names the robot (the name a token was issued for).
    """
    protocol, host, port = split_endpoint(endpoint)
    if protocol not in ("tcp", *ENCRYPTED_PROTOCOLS) or not port.isdigit() or int(port) == 0:
        return None
    pinned = bool(join) and bool(JoinToken.parse(join).certificate)
    if protocol in ENCRYPTED_PROTOCOLS and certificate is None and not pinned:
        return None
    if host in WILDCARD_HOSTS:
        from servo.server.selfsigned import primary_address

        host = str(primary_address(socket.AF_INET) or socket.gethostname())
    with_brackets = f"[{host}]" if _is_ipv6(host) else host
    connect = f"{protocol}/{with_brackets}:{port}"
    given = dict(options or {})
    if fps is not None and fps != DEFAULT_FPS and "fps" not in given:
        given["fps"] = f"{fps:g}"
    parts = ["servo-edge", "--robot", robot]
    for key, value in given.items():
        parts += ["--robot-opt", f"{key}={value}"]
    if buffer_time_s is not None:
        parts += ["--buffer-time-s", f"{buffer_time_s:g}"]
    if client_id:
        parts += ["--client-id", client_id]
    parts += ["--connect", connect]
    if certificate is not None and not join:
        parts += ["--tls-root-ca", certificate.cert.name]
    if exposed_endpoint(connect):  # the server was told --insecure; the edge must be too
        parts.append("--insecure")
    if join:
        parts += ["--join", join]
    return shlex.join(parts)


def arm_options(*, cameras: Sequence[str], units: Sequence[str]) -> dict[str, str]:
    """``--robot-opt`` options of an SO-100/101 arm for a policy: its port, id, the cameras it names, its units.

    ``PORT``, ``ARM`` and ``DEVICE`` stand for what only the robot's computer knows.
    """
    out = {"port": "PORT", "id": "ARM"}
    if cameras:
        out["cameras"] = ",".join(f"{name}:DEVICE" for name in cameras)
    if NormMode.RANGE_M100_100.value in units:  # LeRobot's use_degrees=False checkpoints
        out["use_degrees"] = "false"
    return out


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False
