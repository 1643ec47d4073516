"""A self-signed server certificate for a ``tls/…`` listen that names no certificate.

Made once in a directory (``servo-serve`` uses ``tls/`` in servo's user configuration
directory): an EC P-256 key written with mode 0600 and a certificate that names this host (its
host names, ``localhost``, and every address it has) as subject alternative names. The
certificate is its own trust anchor: an edge passes a copy of it as ``--tls-root-ca``. It is a
leaf with ``basicConstraints CA:FALSE``, since rustls refuses a CA certificate presented as the
server's own (``CaUsedAsEndEntity``, docs/design/zenoh.md §7).

Later starts reuse both files. When the host has a name or address the certificate does not
cover, or the certificate is within `RENEW_BEFORE` of expiring, it is reissued with the same key
and subject (keeping the names it had): a copy an edge already holds still verifies the new one,
because trust anchors on the subject and key of the copy, not on its names or dates.

Both files go through `servo.private_files` (no links followed, this user's alone, replaced
through a new temporary file). Uses ``cryptography`` (the ``server`` extra); the edge never
needs it.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import ipaddress
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from servo.errors import SecurityError
from servo.logs import get_logger
from servo.private_files import PrivateFileError, create_private, private_dir, read_private, write_private

log = get_logger(__name__)

#: How long a certificate is valid (the longest browsers and most TLS stacks accept for a leaf).
VALIDITY = datetime.timedelta(days=825)
#: A certificate this close to expiring is reissued at start.
RENEW_BEFORE = datetime.timedelta(days=30)
CERT_FILE, KEY_FILE = "server.pem", "server.key"
#: Linux ioctl: an interface's IPv4 address.
_SIOCGIFADDR = 0x8915
#: Addresses a connect never means when given as a listen host.
_WILDCARDS = frozenset({"0.0.0.0", "::", ""})

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class CertificateFileError(SecurityError, ValueError):
    """The self-signed certificate's key on disk cannot be used; the message names the file."""


def public_key_pin(cert_pem: bytes) -> bytes:
    """SHA-256 of a PEM certificate's SubjectPublicKeyInfo: what a join token pins (`servo.join`).

    It survives a reissue (`ensure_certificate` keeps the key), unlike a hash of the certificate.
    """
    spki = (
        x509.load_pem_x509_certificate(cert_pem)
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return hashlib.sha256(spki).digest()


@dataclass(frozen=True)
class ServerCertificate:
    """Where the certificate and its key are, what happened to them at this start, what they name."""

    cert: Path
    key: Path
    state: Literal["created", "reused", "reissued"]
    dns_names: list[str]
    addresses: list[str]


def ensure_certificate(directory: Path, *, hosts: Iterable[str] = ()) -> ServerCertificate:
    """The self-signed certificate in ``directory``, made or reissued as needed (module docstring).

    Args:
        directory: Where ``server.pem`` and ``server.key`` live (created 0700 when missing).
        hosts: Names or addresses edges dial besides this host's own (the listen host).

    Raises:
        CertificateFileError: the directory or a file cannot be trusted (`servo.private_files`) or
            written, or ``server.key`` is not an EC private key.
    """
    dns, ips = host_names(hosts)
    try:
        private_dir(directory, "certificate directory")
    except PrivateFileError as exc:
        raise CertificateFileError(str(exc)) from None
    cert_path, key_path = directory / CERT_FILE, directory / KEY_FILE
    key, created = _private_key(key_path)
    state: Literal["created", "reused", "reissued"] = "created" if created else "reissued"
    existing = None if created else _load(cert_path)
    if existing is not None and existing.public_key() == key.public_key():
        had_dns, had_ips = _names_of(existing)
        if dns <= had_dns and ips <= had_ips and _valid_for(existing, RENEW_BEFORE):
            return _described(cert_path, key_path, "reused", had_dns, had_ips)
        dns, ips = dns | had_dns, ips | had_ips
        subject = existing.subject
    else:
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"servo-serve {socket.gethostname()}")])
    # Replaced whole: a reader never sees half a certificate.
    try:
        write_private(cert_path, _issue(key, subject, dns, ips).public_bytes(_PEM), what="certificate")
    except PrivateFileError as exc:
        raise CertificateFileError(str(exc)) from None
    log.info("self-signed certificate written", cert=str(cert_path), state=state, dns=sorted(dns))
    return _described(cert_path, key_path, state, dns, ips)


def host_names(extra: Iterable[str] = ()) -> tuple[set[str], set[Address]]:
    """This host's DNS names and addresses (loopback included), plus ``extra`` names or addresses."""
    dns = {"localhost"}
    ips: set[Address] = {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
    hostname = socket.gethostname()
    for name in (hostname, socket.getfqdn(hostname), *extra):
        name = name.strip("[]")
        if name in _WILDCARDS:
            continue
        try:
            ips.add(ipaddress.ip_address(name.split("%")[0]))
        except ValueError:
            dns.add(name.lower())
    with contextlib.suppress(OSError):
        for *_, sockaddr in socket.getaddrinfo(hostname, None):
            ips.add(ipaddress.ip_address(str(sockaddr[0]).split("%")[0]))
    ips.update(a for a in (primary_address(socket.AF_INET), primary_address(socket.AF_INET6)) if a is not None)
    ips.update(a for a in interface_addresses() if not a.is_link_local)
    return dns, ips


def interface_addresses() -> set[Address]:
    """Every interface's addresses where the OS lists them (Linux); empty elsewhere.

    IPv4 from ``SIOCGIFADDR`` per interface, IPv6 from ``/proc/net/if_inet6``.
    """
    found: set[Address] = set()
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        return found
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):
                request = struct.pack("256s", name.encode()[:15])
                found.add(ipaddress.IPv4Address(fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)[20:24]))
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            found.add(ipaddress.IPv6Address(bytes.fromhex(line.split()[0])))
    return found


def primary_address(family: socket.AddressFamily) -> Address | None:
    """The address this host reaches other networks from (its default route), None when offline.

    A UDP socket "connected" to a public address picks the outgoing interface; nothing is sent.
    """
    target = ("192.0.2.1", 9) if family == socket.AF_INET else ("2001:db8::1", 9)  # documentation ranges
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(target)
            address = ipaddress.ip_address(str(probe.getsockname()[0]).split("%")[0])
    except OSError:
        return None
    return None if address.is_loopback or address.is_unspecified or address.is_link_local else address


_PEM = serialization.Encoding.PEM
_NO_PASSWORD = serialization.NoEncryption()


def _issue(key: ec.EllipticCurvePrivateKey, subject: x509.Name, dns: set[str], ips: set[Address]) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in sorted(dns)]
    names += [x509.IPAddress(a) for a in sorted(ips, key=lambda a: (a.version, int(a)))]
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks of edges a little behind
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(key, hashes.SHA256())
    )


def _load(path: Path) -> x509.Certificate | None:
    try:
        return x509.load_pem_x509_certificate(read_private(path, what="certificate", secret=False))
    except FileNotFoundError:
        return None
    except PrivateFileError as exc:
        raise CertificateFileError(str(exc)) from None
    except ValueError as exc:
        log.warning("self-signed certificate unreadable: reissued", cert=str(path), error=str(exc))
        return None


def _names_of(cert: x509.Certificate) -> tuple[set[str], set[Address]]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set(), set()
    addresses = san.get_values_for_type(x509.IPAddress)
    return set(san.get_values_for_type(x509.DNSName)), {a for a in addresses if isinstance(a, Address)}


def _valid_for(cert: x509.Certificate, margin: datetime.timedelta) -> bool:
    now = datetime.datetime.now(datetime.UTC)
    return cert.not_valid_before_utc <= now and now + margin < cert.not_valid_after_utc


def _described(
    cert: Path, key: Path, state: Literal["created", "reused", "reissued"], dns: set[str], ips: set[Address]
) -> ServerCertificate:
    addresses = [str(a) for a in sorted(ips, key=lambda a: (a.version, int(a)))]
    return ServerCertificate(cert, key, state, sorted(dns), addresses)


def _private_key(path: Path) -> tuple[ec.EllipticCurvePrivateKey, bool]:
    """The key at ``path``, created (mode 0600, never readable by others even briefly) when missing."""
    try:
        return _read_key(path), False
    except FileNotFoundError:
        pass
    key = ec.generate_private_key(ec.SECP256R1())
    try:
        created = create_private(
            path, key.private_bytes(_PEM, serialization.PrivateFormat.PKCS8, _NO_PASSWORD), what="private key"
        )
    except PrivateFileError as exc:
        raise CertificateFileError(str(exc)) from None
    return (key, True) if created else (_read_key(path), False)


def _read_key(path: Path) -> ec.EllipticCurvePrivateKey:
    try:
        data = read_private(path, what="private key", secret=True)
    except PrivateFileError as exc:
        raise CertificateFileError(str(exc)) from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        key, problem = None, str(exc)
    else:
        problem = "not an EC key"
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertificateFileError(f"{path}: not a usable private key ({problem}); delete it to make a new one")
    return key
