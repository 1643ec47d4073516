"""A robot joining a server with a token (`servo.join`): whom to trust, before first contact.

Before the robot connects (`prepare_join`, off the event loop):

1. **The server's identity** named in the token becomes the one trusted for the deployment in
   ``known_servers`` (`servo.client.known`), exactly as ``servo-edge trust`` would make it: first
   contact needs no trust on first use, and any other server, alone on the network or not, is
   refused.
2. **The server's certificate**, when the token pins one and the robot dials ``tls/…`` without a
   CA of its own (``--tls-root-ca``): fetched from that endpoint with a bare TLS handshake (the
   server proves it holds the certificate's key in the handshake), accepted only if its public
   key hashes to the token's pin, and kept in ``tls/pinned/`` of servo's directory. A copy kept
   earlier is used without dialling.

Then every session open carries the token's proof (`servo.join.sign_join`, done in
`servo.client.trust.signed_open`): the first one enrols the robot; later ones (the same command
run again) are opens of an enrolled robot, and the spent token is ignored.
"""

from __future__ import annotations

import hashlib
import socket
import ssl
from collections.abc import Sequence
from pathlib import Path

from servo.client.errors import ClientError
from servo.client.known import KnownServers
from servo.home import pinned_certificates_dir
from servo.join import JoinToken
from servo.logs import get_logger
from servo.private_files import PrivateFileError, private_dir, read_private, write_private
from servo.transport.certificate import CertificateError, public_key_info
from servo.wire import fingerprint

log = get_logger(__name__)

#: How long one attempt to fetch the certificate may take (s).
FETCH_TIMEOUT_S = 5.0


class JoinError(ClientError):
    """The join cannot go on; the message says why in one line. ``refused``: retrying cannot help."""

    def __init__(self, message: str, *, refused: bool) -> None:
        super().__init__(message)
        self.refused = refused


def trust_server(token: JoinToken, selector: str, known: KnownServers) -> None:
    """Make the token's server the one trusted for ``selector`` (``app/model``) in ``known``."""
    if known.identities(selector) == {token.server}:
        return
    known.replace(selector, [token.server])
    log.info("server trusted from the join token", selector=selector, identity=fingerprint(token.server))


def pinned_certificate(token: JoinToken, connect: Sequence[str], directory: Path | None = None) -> Path | None:
    """The certificate the token pins, kept in ``directory`` (fetched first when needed); None if it pins none.

    Raises:
        JoinError: no ``tls/`` endpoint to fetch it from, the endpoint cannot be reached, or it
            presents a certificate the token does not pin.
    """
    if not token.certificate:
        return None
    directory = directory or pinned_certificates_dir()
    path = directory / f"{token.certificate.hex()[:32]}.pem"
    try:
        if _pin_of(read_private(path, what="pinned certificate", secret=False)) == token.certificate:
            return path
    except (FileNotFoundError, CertificateError, ValueError):
        pass
    endpoints = [e for e in connect if e.startswith("tls/")]
    if not endpoints:
        raise JoinError("--join: the token pins a TLS certificate but no --connect endpoint is tls/…", refused=True)
    pem = fetch_certificate(endpoints[0], token.certificate)
    try:
        private_dir(directory, "pinned certificates directory")
        write_private(path, pem, what="pinned certificate")
    except PrivateFileError as exc:
        raise JoinError(str(exc), refused=True) from None
    log.info("server certificate pinned from the join token", endpoint=endpoints[0], path=str(path))
    return path


def fetch_certificate(endpoint: str, pin: bytes, timeout: float = FETCH_TIMEOUT_S) -> bytes:
    """The PEM certificate the TLS endpoint ``tls/host:port`` presents, if its key hashes to ``pin``.

    Raises:
        JoinError: unreachable, no TLS there, or another certificate.
    """
    address = endpoint.partition("/")[2].split("?")[0].split("#")[0]
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    # Verified below by its pinned key, which the handshake proved the server holds.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, int(port)), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host or None) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
    except (OSError, ValueError) as exc:
        raise JoinError(
            f"--join: cannot fetch the server's certificate from {endpoint} ({exc}); is servo-serve running there?",
            refused=False,
        ) from None
    if der is None or _pin_of_der(der) != pin:
        raise JoinError(
            f"--join: {endpoint} presents a certificate the token does not pin (another server, or someone in "
            "between); ask the server's operator for a new token",
            refused=True,
        )
    return ssl.DER_cert_to_PEM_cert(der).encode()


def _pin_of_der(der: bytes) -> bytes | None:
    try:
        return hashlib.sha256(public_key_info(der)).digest()
    except CertificateError:
        return None


def _pin_of(pem: bytes) -> bytes | None:
    return _pin_of_der(ssl.PEM_cert_to_DER_cert(pem.decode("ascii")))
