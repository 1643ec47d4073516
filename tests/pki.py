"""Certificates for TLS tests, generated in the test (EC P-256, valid for a day).

The shapes follow docs/design/zenoh.md §7: a CA with ``basicConstraints CA:TRUE`` and leaves with
``CA:FALSE``; a leaf that is dialled (a router, a listening server) carries the address as SAN.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Leaf:
    """Paths of one PEM certificate and its private key."""

    cert: str
    key: str


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


class Pki:
    """A CA in ``directory`` that issues leaves named by their common name."""

    def __init__(self, directory: Path, name: str = "fleet-ca") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._now = datetime.datetime.now(datetime.UTC)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._cert = (
            self._builder(_name(name), _name(name), self._key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.ca = self._write(name, self._key, self._cert).cert

    def issue(self, cn: str, *, ip: str | None = None, file_name: str | None = None) -> Leaf:
        """A leaf with common name ``cn`` (and SAN ``ip`` when it is dialled)."""
        key = ec.generate_private_key(ec.SECP256R1())
        builder = self._builder(_name(cn), self._cert.subject, key).add_extension(
            x509.BasicConstraints(ca=False, path_length=None), critical=True
        )
        if ip is not None:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), critical=False
            )
        return self._write(file_name or cn, key, builder.sign(self._key, hashes.SHA256()))

    def _builder(
        self, subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
    ) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._now - datetime.timedelta(minutes=5))
            .not_valid_after(self._now + datetime.timedelta(days=1))
        )

    def _write(self, stem: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> Leaf:
        key_path, cert_path = self.directory / f"{stem}.key", self.directory / f"{stem}.pem"
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return Leaf(str(cert_path), str(key_path))
