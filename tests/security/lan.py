"""A server set up as the CLI suggests for a LAN (``--listen tls/0.0.0.0:PORT``), in-process.

It listens on every interface (as the suggested set-up does) and tests dial it on 127.0.0.1; what
makes it "off loopback" is the configured endpoint, not the address a test dials. Robots get their
own identity and known-servers files in the test's directory: a fresh machine each.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from servo.cli.listen import secure_listen
from servo.client import PolicyClient, TrustedServers
from servo.identity import load_identity
from servo.join import JoinToken
from servo.server.manifest import parse_manifest
from servo.server.service import PolicyServer, ServerReady
from servo.transport import TlsSettings, ZenohSettings
from tests.security.peers import sim_policy_spec
from tests.server.policies import FixedComputePolicy
from tests.support import running_server


def lan_manifest_text(port: int, *, serving: str = "", security: str = "") -> str:
    """A reference-shaped server on ``tls/0.0.0.0:port`` (the robots' sim camera), no health port."""
    return (
        f'[model]\nsource = "injected"\nwarmup = 1\n[serving]\n{serving}\n'
        f'[zenoh]\nlisten = ["tls/0.0.0.0:{port}"]\n[ops]\nhealth_port = 0\n[security]\n{security}\n'
    )


@asynccontextmanager
async def lan_server(port: int, **text: str) -> AsyncIterator[tuple[PolicyServer, ServerReady]]:
    """The LAN server (its self-signed certificate made as ``servo-serve`` makes it)."""
    manifest, _ = secure_listen(parse_manifest(lan_manifest_text(port, **text)))
    policy = FixedComputePolicy(compute_ms=20, **sim_policy_spec(chunk_size=20))
    async with running_server(manifest, policy) as (server, ready):
        yield server, ready


def certificate_of(server: PolicyServer) -> str:
    """The server's self-signed certificate (what a stranger copies from the handshake)."""
    tls = server.manifest.zenoh.tls
    assert tls is not None
    assert tls.listen_certificate
    return tls.listen_certificate


def robot_files(tmp_path: Path, name: str) -> dict[str, str]:
    """Edge options giving robot ``name`` files of its own (a fresh machine)."""
    home = tmp_path / name
    home.mkdir(mode=0o700, exist_ok=True)
    return {"identity_key": str(home / "robot.key"), "known_servers": str(home / "known_servers")}


@asynccontextmanager
async def lan_client(
    server: PolicyServer, port: int, tmp_path: Path, name: str, *, join: str = "", quic: bool = False, **options: Any
) -> AsyncIterator[PolicyClient]:
    """A `PolicyClient` of robot ``name`` (its own identity) over TLS (or QUIC), trusting the server's identity."""
    files = robot_files(tmp_path, name)
    settings = ZenohSettings(
        mode="client",
        connect=[f"{'quic' if quic else 'tls'}/127.0.0.1:{port}"],
        tls=TlsSettings(root_ca_certificate=certificate_of(server)),
    )
    identity = load_identity(files["identity_key"], role="robot")
    trusted = TrustedServers(identities=frozenset({server.state.replica.identity.public_key}))
    token = JoinToken.parse(join) if join else None
    async with PolicyClient.connect(settings, name, identity=identity, trusted=trusted, join=token, **options) as c:
        yield c
