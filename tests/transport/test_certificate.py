"""The edge reads its certificate's common name with a tiny DER walk (no cryptography at run time)."""

from __future__ import annotations

import contextlib
import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.name import _ASN1Type
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from servo.config import ConfigError
from servo.edge.config import EdgeConfig, SecurityConfig
from servo.transport import CertificateError, common_name
from servo.transport.certificate import subject_common_name
from tests.pki import Pki


def certificate(tmp_path: Path, *attributes: x509.NameAttribute) -> Path:
    """A self-signed certificate whose subject is ``attributes``, as a PEM file."""
    path = tmp_path / f"cert-{len(list(tmp_path.iterdir()))}.pem"
    path.write_bytes(build(*attributes).public_bytes(serialization.Encoding.PEM))
    return path


def build(*attributes: x509.NameAttribute) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name(list(attributes))
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "issuer")]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )


def cn(value: str, kind: _ASN1Type = _ASN1Type.UTF8String) -> x509.NameAttribute:
    return x509.NameAttribute(NameOID.COMMON_NAME, value, _type=kind)


@pytest.mark.parametrize("kind", [_ASN1Type.UTF8String, _ASN1Type.PrintableString, _ASN1Type.BMPString])
def test_the_common_name_is_read_whatever_its_string_type(tmp_path: Path, kind: _ASN1Type) -> None:
    org = x509.NameAttribute(NameOID.ORGANIZATION_NAME, "lab")
    assert common_name(certificate(tmp_path, org, cn("robot-7", kind))) == "robot-7"


def test_a_fleet_certificate_names_its_robot(tmp_path: Path) -> None:
    leaf = Pki(tmp_path).issue("robot-8")
    assert common_name(leaf.cert) == "robot-8"
    assert (
        EdgeConfig(
            security=SecurityConfig(tls_root_ca=leaf.cert, tls_cert=leaf.cert, tls_key=leaf.key)
        ).resolved_client_id("x")
        == "robot-8"
    )
    assert (
        EdgeConfig(client_id="r9", security=SecurityConfig(tls_cert=leaf.cert, tls_key=leaf.key)).resolved_client_id(
            "x"
        )
        == "r9"
    )


@pytest.mark.parametrize(
    ("subject", "problem"),
    [
        ((), "0 common names"),
        ((cn("a"), cn("b")), "2 common names"),
        ((x509.NameAttribute(NameOID.ORGANIZATION_NAME, "lab"),), "0 common names"),
    ],
)
def test_not_exactly_one_common_name_is_refused(
    tmp_path: Path, subject: tuple[x509.NameAttribute, ...], problem: str
) -> None:
    with pytest.raises(CertificateError, match=problem):
        common_name(certificate(tmp_path, *subject))


def test_files_that_are_no_certificate_are_refused_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    with pytest.raises(CertificateError, match=r"missing\.pem"):
        common_name(missing)
    for text, problem in [
        (b"hello", "no PEM certificate"),
        (b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n", "not valid base64"),
        (b"-----BEGIN CERTIFICATE-----\nMAMCAQE=\n-----END CERTIFICATE-----\n", "unexpected DER tag"),
    ]:
        path = tmp_path / "bad.pem"
        path.write_bytes(text)
        with pytest.raises(CertificateError, match=problem):
            common_name(path)


def test_a_common_name_that_is_no_client_id_asks_for_one(tmp_path: Path) -> None:
    path = certificate(tmp_path, cn("robot 7/evil"))
    config = EdgeConfig(security=SecurityConfig(tls_cert=str(path), tls_key=str(path)))
    with pytest.raises(ConfigError, match=r"pass --client-id <CN>"):
        config.resolved_client_id("x")


@settings(max_examples=500)
@given(st.binary(max_size=300))
def test_the_der_walk_refuses_garbage_with_its_own_error_only(der: bytes) -> None:
    with contextlib.suppress(CertificateError):
        subject_common_name(der)


DER = build(x509.NameAttribute(NameOID.COMMON_NAME, "robot-7")).public_bytes(serialization.Encoding.DER)


@settings(max_examples=1000)
@given(st.lists(st.tuples(st.integers(0, len(DER) - 1), st.integers(0, 255)), min_size=1, max_size=4), st.booleans())
def test_a_mutated_certificate_reads_or_is_refused_never_crashes(edits: list[tuple[int, int]], cut: bool) -> None:
    der = bytearray(DER)
    for at, byte in edits:
        der[at] = byte
    if cut:
        del der[edits[0][0] :]
    try:
        name = subject_common_name(bytes(der))
    except CertificateError:
        return
    assert isinstance(name, str)
