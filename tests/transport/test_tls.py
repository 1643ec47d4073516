"""TLS and mTLS links: a server behind a TLS listener serves an edge that trusts its CA; a client
without the right CA (or, under mTLS, without a certificate) cannot connect."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import numpy as np
import pytest
import zenoh
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from servo.client import PolicyClient
from servo.server.manifest import parse_manifest
from servo.transport import TlsSettings, ZenohSettings, open_session
from tests.support import running_server

pytestmark = pytest.mark.anyio


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[str, str]:
    path.with_suffix(".key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.with_suffix(".pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path.with_suffix(".pem")), str(path.with_suffix(".key"))


def make_pki(tmp: Path, name: str) -> dict[str, str]:
    """A CA, a server leaf for 127.0.0.1 and a client leaf (CN robot-7), all EC P-256."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name(f"{name}-ca"))
        .issuer_name(_name(f"{name}-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    out = {"ca": _write(tmp / f"{name}-ca", ca_key, ca)[0]}
    for leaf, cn in (("server", "127.0.0.1"), ("client", "robot-7")):
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if leaf == "server":
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
            )
        out[f"{leaf}_cert"], out[f"{leaf}_key"] = _write(
            tmp / f"{name}-{leaf}", key, builder.sign(ca_key, hashes.SHA256())
        )
    return out


def tls_manifest(port: int, pki: dict[str, str], *, mtls: bool) -> str:
    return f"""
[model]
source = "reference"
warmup = 1
[model.options]
cameras = {{front = [48, 64]}}
[zenoh]
listen = ["tls/127.0.0.1:{port}"]
[zenoh.tls]
listen_certificate = "{pki["server_cert"]}"
listen_private_key = "{pki["server_key"]}"
root_ca_certificate = "{pki["ca"]}"
enable_mtls = {str(mtls).lower()}
[ops]
health_port = 0
"""


def edge_settings(port: int, ca: str, *, cert: str | None = None, key: str | None = None) -> ZenohSettings:
    tls = TlsSettings(
        root_ca_certificate=ca, connect_certificate=cert, connect_private_key=key, enable_mtls=cert is not None
    )
    return ZenohSettings(mode="client", connect=[f"tls/127.0.0.1:{port}"], tls=tls)


async def infer_once(settings: ZenohSettings) -> tuple[int, int]:
    async with PolicyClient.connect(settings, "tls-arm") as client:
        (server,) = await client.discover()
        session = await client.open_session(server, features=server.status.policy.features, fps=30)
        result = await session.infer(np.zeros(6, np.float32), {"front": np.zeros((48, 64, 3), np.uint8)}, timeout=10)
        await session.close()
        return result.chunk_robot.shape


async def test_edge_reaches_a_tls_server_it_trusts(tmp_path: Path, port: int) -> None:
    pki = make_pki(tmp_path, "lab")
    async with running_server(parse_manifest(tls_manifest(port, pki, mtls=False))):
        assert await infer_once(edge_settings(port, pki["ca"])) == (50, 6)


async def test_edge_refuses_a_server_signed_by_another_ca(tmp_path: Path, port: int) -> None:
    pki, other = make_pki(tmp_path, "lab"), make_pki(tmp_path, "rogue")
    async with running_server(parse_manifest(tls_manifest(port, pki, mtls=False))):
        with pytest.raises(zenoh.ZError):
            async with open_session(edge_settings(port, other["ca"])):
                pass


async def test_mtls_requires_a_client_certificate_from_the_ca(tmp_path: Path, port: int) -> None:
    pki = make_pki(tmp_path, "lab")
    async with running_server(parse_manifest(tls_manifest(port, pki, mtls=True))):
        assert await infer_once(edge_settings(port, pki["ca"], cert=pki["client_cert"], key=pki["client_key"])) == (
            50,
            6,
        )
        with pytest.raises(zenoh.ZError):
            async with open_session(edge_settings(port, pki["ca"])):
                pass
