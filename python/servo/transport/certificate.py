"""The common name and public key of a certificate, read with a tiny DER walk (no ``cryptography`` on the edge).

Behind a ``servo-router`` a robot's name is its certificate's common name (the router's access
control is keyed by it), so the edge defaults its client id to it. Only what that needs is read:
the first certificate of the PEM file, its subject, and exactly one CN attribute in a UTF8,
printable, IA5 or BMP string. The walk is bounded (the file, every length checked against what is
left, no indefinite lengths) and anything else is refused with `CertificateError`: the caller then
asks for ``--client-id``.

A robot joining with a token that pins the server's certificate (`servo.join`) reads the
certificate's SubjectPublicKeyInfo the same way (`public_key_info`) and compares its hash.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from servo.errors import SecurityError

#: Certificates are a few kB; refuse to read more than this.
MAX_PEM_BYTES = 256 * 1024
_BEGIN, _END = b"-----BEGIN CERTIFICATE-----", b"-----END CERTIFICATE-----"
_SEQUENCE, _SET, _OID, _INTEGER, _VERSION = 0x30, 0x31, 0x06, 0x02, 0xA0
_CN_OID = bytes([0x55, 0x04, 0x03])  # 2.5.4.3
_STRINGS = {0x0C: "utf-8", 0x13: "ascii", 0x16: "ascii", 0x1E: "utf-16-be"}


class CertificateError(SecurityError, ValueError):
    """The certificate's common name cannot be read; the message says why."""


def common_name(path: str | Path) -> str:
    """The subject common name of the first certificate in a PEM file.

    Raises:
        CertificateError: unreadable, not PEM, malformed DER, or not exactly one readable CN.
    """
    try:
        with Path(path).open("rb") as f:
            pem = f.read(MAX_PEM_BYTES + 1)
    except OSError as exc:
        raise CertificateError(f"{path}: {exc.strerror or exc}") from None
    if len(pem) > MAX_PEM_BYTES:
        raise CertificateError(f"{path}: larger than {MAX_PEM_BYTES} bytes")
    start, end = pem.find(_BEGIN), pem.find(_END)
    if start < 0 or end < start:
        raise CertificateError(f"{path}: no PEM certificate")
    try:
        der = base64.b64decode(b"".join(pem[start + len(_BEGIN) : end].split()), validate=True)
    except (binascii.Error, ValueError):
        raise CertificateError(f"{path}: the PEM certificate is not valid base64") from None
    try:
        return subject_common_name(der)
    except CertificateError as exc:
        raise CertificateError(f"{path}: {exc}") from None


def _to_subject(der: bytes) -> _Reader:
    """The reader of a DER certificate's TBS fields, positioned at its subject."""
    cert = _Reader(der).one(_SEQUENCE)
    tbs = _Reader(cert).take(_SEQUENCE)
    fields = _Reader(tbs)
    if fields.peek() == _VERSION:
        fields.take(_VERSION)
    fields.take(_INTEGER)  # serial number
    fields.take(_SEQUENCE)  # signature algorithm
    fields.take(_SEQUENCE)  # issuer
    fields.take(_SEQUENCE)  # validity
    return fields


def public_key_info(der: bytes) -> bytes:
    """The whole SubjectPublicKeyInfo (tag and length included) of a DER certificate.

    Raises:
        CertificateError: malformed.
    """
    fields = _to_subject(der)
    fields.take(_SEQUENCE)  # subject
    return fields.raw(_SEQUENCE)


def subject_common_name(der: bytes) -> str:
    """The subject CN of a DER certificate.

    Raises:
        CertificateError: malformed, or not exactly one CN in a supported string type.
    """
    subject = _Reader(_to_subject(der).take(_SEQUENCE))
    names = []
    while not subject.done:
        rdn = _Reader(subject.take(_SET))
        while not rdn.done:
            attribute = _Reader(rdn.take(_SEQUENCE))
            if attribute.take(_OID) == _CN_OID:
                tag, value = attribute.any()
                encoding = _STRINGS.get(tag)
                if encoding is None:
                    raise CertificateError(f"the common name is in an unsupported string type (tag {tag:#x})")
                try:
                    names.append(value.decode(encoding))
                except UnicodeDecodeError:
                    raise CertificateError("the common name is not valid text") from None
    if len(names) != 1:
        raise CertificateError(f"the subject has {len(names)} common names, expected one")
    return names[0]


class _Reader:
    """Reads DER TLVs from a buffer, every length checked against what is left (one call owns it)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    @property
    def done(self) -> bool:
        return self._pos >= len(self._data)

    def peek(self) -> int | None:
        return None if self.done else self._data[self._pos]

    def any(self) -> tuple[int, bytes]:
        data, pos = self._data, self._pos
        if pos + 2 > len(data):
            raise CertificateError("truncated DER")
        tag, first = data[pos], data[pos + 1]
        if tag & 0x1F == 0x1F:
            raise CertificateError("unsupported DER tag")
        pos += 2
        if first < 0x80:
            length = first
        else:
            count = first & 0x7F
            if count == 0 or count > 4 or pos + count > len(data):
                raise CertificateError("unsupported or truncated DER length")
            length = int.from_bytes(data[pos : pos + count], "big")
            pos += count
        if length > len(data) - pos:
            raise CertificateError("DER length runs past the end")
        self._pos = pos + length
        return tag, data[pos : pos + length]

    def raw(self, tag: int) -> bytes:
        start = self._pos
        self.take(tag)
        return self._data[start : self._pos]

    def take(self, tag: int) -> bytes:
        got, value = self.any()
        if got != tag:
            raise CertificateError(f"unexpected DER tag {got:#x}, expected {tag:#x}")
        return value

    def one(self, tag: int) -> bytes:
        value = self.take(tag)
        if not self.done:
            raise CertificateError("trailing bytes after the certificate")
        return value
