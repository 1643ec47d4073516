"""TLS and mTLS links: a server behind a TLS listener serves an edge that trusts its CA; a client
without the right CA (or, under mTLS, without a certificate) cannot connect."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zenoh

from servo.client import PolicyClient
from servo.server.manifest import parse_manifest
from servo.transport import TlsSettings, ZenohSettings, open_zsession
from tests.pki import Pki
from tests.support import running_server

pytestmark = pytest.mark.anyio


def make_pki(tmp: Path, name: str) -> dict[str, str]:
    """A CA, a server leaf for 127.0.0.1 and a client leaf (CN robot-7), all EC P-256."""
    pki = Pki(tmp / name, f"{name}-ca")
    server = pki.issue("127.0.0.1", ip="127.0.0.1", file_name="server")
    client = pki.issue("robot-7", file_name="client")
    return {
        "ca": pki.ca,
        "server_cert": server.cert,
        "server_key": server.key,
        "client_cert": client.cert,
        "client_key": client.key,
    }


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
            async with open_zsession(edge_settings(port, other["ca"])):
                pass


async def test_mtls_requires_a_client_certificate_from_the_ca(tmp_path: Path, port: int) -> None:
    pki = make_pki(tmp_path, "lab")
    async with running_server(parse_manifest(tls_manifest(port, pki, mtls=True))):
        assert await infer_once(edge_settings(port, pki["ca"], cert=pki["client_cert"], key=pki["client_key"])) == (
            50,
            6,
        )
        with pytest.raises(zenoh.ZError):
            async with open_zsession(edge_settings(port, pki["ca"])):
                pass
