"""The self-signed certificate of a TLS listen with none configured: made once, a leaf naming this
host, its key private; reissued for a new name with the same key, so an edge's older copy still
verifies it over a real TLS link (rustls, through Zenoh)."""

from __future__ import annotations

import ipaddress
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import zenoh
from cryptography import x509

from servo.server.manifest import parse_manifest
from servo.server.selfsigned import CertificateFileError, ensure_certificate
from servo.transport import TlsSettings, ZenohSettings, open_zsession

pytestmark = pytest.mark.anyio


def test_made_once_as_a_leaf_naming_this_host_with_a_private_key(tmp_path: Path) -> None:
    directory = tmp_path / "config" / "tls"
    made = ensure_certificate(directory)
    assert made.state == "created"
    assert stat.S_IMODE(made.key.stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    cert = x509.load_pem_x509_certificate(made.cert.read_bytes())
    assert cert.issuer == cert.subject  # self-signed: the certificate is its own trust anchor
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value.ca is False  # rustls refuses a CA certificate used as the server's own
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")} <= set(
        san.get_values_for_type(x509.IPAddress)
    )
    pem, key = made.cert.read_bytes(), made.key.read_bytes()
    again = ensure_certificate(directory)
    assert again.state == "reused"
    assert (again.cert.read_bytes(), again.key.read_bytes()) == (pem, key)


def test_a_new_listen_name_reissues_with_the_same_key_and_keeps_the_old_names(tmp_path: Path) -> None:
    first = ensure_certificate(tmp_path, hosts=["10.11.12.13"])
    key = first.key.read_bytes()
    second = ensure_certificate(tmp_path, hosts=["gpu-box.lab", "10.11.12.13"])
    assert second.state == "reissued"
    assert second.key.read_bytes() == key
    assert "gpu-box.lab" in second.dns_names
    assert "10.11.12.13" in second.addresses
    assert set(first.dns_names) <= set(second.dns_names)
    assert ensure_certificate(tmp_path, hosts=["gpu-box.lab"]).state == "reused"
    assert ensure_certificate(tmp_path, hosts=["0.0.0.0", "[::]"]).state == "reused"  # wildcards name nothing


def test_a_key_readable_by_others_is_refused_not_used(tmp_path: Path) -> None:
    made = ensure_certificate(tmp_path)
    os.chmod(made.key, 0o644)
    with pytest.raises(CertificateFileError, match=r"server\.key: private key is accessible by others \(mode 0644\)"):
        ensure_certificate(tmp_path)
    os.chmod(made.key, 0o600)
    made.key.write_text("not a key")
    with pytest.raises(CertificateFileError, match="not a usable private key"):
        ensure_certificate(tmp_path)


def server_settings(port: int, cert: Path, key: Path) -> ZenohSettings:
    manifest = parse_manifest(
        f'[model]\nsource = "reference"\n[zenoh]\nlisten = ["tls/127.0.0.1:{port}"]\n'
        f'[zenoh.tls]\nlisten_certificate = "{cert}"\nlisten_private_key = "{key}"\n'
    )
    return manifest.zenoh


async def reaches(port: int, root_ca: Path) -> bool:
    """Whether a client trusting ``root_ca`` opens a TLS session to the listener on ``port``."""
    settings = ZenohSettings(
        mode="client", connect=[f"tls/127.0.0.1:{port}"], tls=TlsSettings(root_ca_certificate=str(root_ca))
    )
    try:
        async with open_zsession(settings):
            return True
    except zenoh.ZError:  # a refused certificate: zenoh says "Unable to connect", the cause is in its log
        return False


async def test_an_edges_older_copy_trusts_the_reissued_certificate(tmp_path: Path, port: int) -> None:
    first = ensure_certificate(tmp_path / "tls")
    shutil.copy(first.cert, tmp_path / "copied.pem")  # what the robot holds
    reissued = ensure_certificate(tmp_path / "tls", hosts=["gpu-box.lab"])
    assert reissued.state == "reissued"
    stranger = ensure_certificate(tmp_path / "other")  # another host's certificate
    async with open_zsession(server_settings(port, reissued.cert, reissued.key)):
        assert await reaches(port, tmp_path / "copied.pem")
        assert await reaches(port, reissued.cert)
        assert not await reaches(port, stranger.cert)


def test_the_edge_never_imports_cryptography() -> None:
    """The remote edge and the client library stay free of the server extra's certificate package."""
    code = "import sys, servo.cli.edge, servo.edge.remote, servo.client; print('cryptography' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "False"
