"""``servo-serve`` on the network, securely without setting up certificates.

A ``tls/…`` listen endpoint with no certificate in the manifest (``[zenoh.tls]
listen_certificate``) gets servo's own self-signed one (`servo.server.selfsigned`), kept in
``tls/`` of servo's user configuration directory and made once; ``servo-serve`` then prints the
``servo-edge`` commands that trust it (the robot's copy of the certificate as
``--tls-root-ca``). A fleet with its own CA configures ``[zenoh.tls]`` instead (docs/guides/fleet.md,
*Certificates*).
"""

from __future__ import annotations

import ipaddress
import shlex
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from msgspec.structs import replace

from servo.cli.ports import split_endpoint
from servo.home import config_dir, ensure_config_dir
from servo.robots.builtin import SimOptions
from servo.robots.camera_list import parse_cameras
from servo.server.manifest import Manifest
from servo.transport import TlsSettings, exposed_endpoint

if TYPE_CHECKING:
    from servo.server.selfsigned import ServerCertificate

#: Listen hosts that mean every interface: an edge dials one of this host's addresses instead.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
#: What the simulated arm runs with when given no options (``servo-edge --robot sim``).
_SIM = SimOptions()


def certificate_dir() -> Path:
    """Where the self-signed server certificate and its key live."""
    return config_dir() / "tls"


def secure_listen(manifest: Manifest) -> tuple[Manifest, ServerCertificate | None]:
    """The manifest with the self-signed certificate in place when a TLS listen has none.

    Raises:
        OSError: the certificate directory or files cannot be written or read.
        CertificateFileError: the key on disk is unusable (named).
    """
    z = manifest.zenoh
    hosts = [host for protocol, host, _ in map(split_endpoint, z.listen) if protocol == "tls"]
    if not hosts or (z.tls is not None and z.tls.listen_certificate):
        return manifest, None
    from servo.server.selfsigned import ensure_certificate  # cryptography: the server extra

    ensure_config_dir()
    certificate = ensure_certificate(certificate_dir(), hosts=hosts)
    files = {"listen_certificate": str(certificate.cert), "listen_private_key": str(certificate.key)}
    tls = replace(z.tls or TlsSettings(), **files)
    return replace(manifest, zenoh=replace(z, tls=tls)), certificate


def edge_command(
    endpoint: str,
    *,
    robot: str,
    certificate: ServerCertificate | None,
    options: Sequence[str] = (),
) -> str | None:
    """The ``servo-edge`` command that reaches a server listening on ``endpoint`` (None if unknown).

    A TLS endpoint is described only with servo's self-signed certificate (the edge trusts its
    copy, named like the original); a wildcard host becomes this host's primary address.
    """
    protocol, host, port = split_endpoint(endpoint)
    if protocol not in ("tcp", "tls") or not port.isdigit() or int(port) == 0:
        return None
    if protocol == "tls" and certificate is None:
        return None
    if host in WILDCARD_HOSTS:
        from servo.server.selfsigned import primary_address

        host = str(primary_address(socket.AF_INET) or socket.gethostname())
    with_brackets = f"[{host}]" if _is_ipv6(host) else host
    connect = f"{protocol}/{with_brackets}:{port}"
    parts = ["servo-edge", "--robot", robot, *options, "--connect", connect]
    if certificate is not None:
        parts += ["--tls-root-ca", certificate.cert.name]
    if exposed_endpoint(connect):  # the server was told --insecure; the edge must be too
        parts.append("--insecure")
    return shlex.join(parts)


def robot_options(*, cameras: Sequence[str], fps: float, sim: bool) -> list[str]:
    """``--robot-opt`` flags a robot needs to match the policy (cameras it names, its rate)."""
    out: list[str] = []
    if sim and not set(cameras) <= {entry.name for entry in parse_cameras(_SIM.cameras)}:
        out += ["--robot-opt", f"cameras={','.join(cameras)}"]
    elif not sim:
        out += ["--robot-opt", "port=PORT", "--robot-opt", "id=ARM"]
        if cameras:
            out += ["--robot-opt", "cameras=" + ",".join(f"{name}:DEVICE" for name in cameras)]
    if fps != _SIM.fps:  # the SO arms' default rate is the sim's
        out += ["--robot-opt", f"fps={fps:g}"]
    return out


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False
