"""The openpi door off loopback: TLS and an API key, and a capacity that is its own.

Issue 29: ``--openpi-listen 0.0.0.0:PORT`` started a plain WebSocket door with no authentication;
a stranger on the host's network address got chunks, and eight such connections filled the
server: an enrolled robot exited with ``capacity: server is full (8/8 sessions)``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import InvalidStatus

from servo.cli.console import Console
from servo.cli.listen import secure_listen
from servo.cli.robots import main as robots_cli
from servo.config import ConfigError
from servo.frontends.openpi_gate import OpenpiGate
from servo.server.manifest import Manifest
from servo.server.service import PolicyServer, ServerReady
from tests.frontends.helpers import aloha_obs, blocking, served_until_closed, serving_door
from tests.server.helpers import connected, open_on, server_manifest
from tests.server.policies import FixedComputePolicy
from tests.support import free_port

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"),
]


def door_manifest(listen: str, *, serving: str = "", security: str = "") -> Manifest:
    return server_manifest(
        free_port(), serving=serving, extra=f'[frontends.openpi]\nlisten = "{listen}"\n[security]\n{security}\n'
    )


def door(manifest: Manifest) -> AbstractAsyncContextManager[tuple[PolicyServer, ServerReady, int]]:
    """The server with its openpi door, set up as ``servo-serve`` sets it up (its certificate made)."""
    return serving_door(secure_listen(manifest)[0], FixedComputePolicy())


def api_key(name: str, capsys: pytest.CaptureFixture[str]) -> str:
    """An API key made by ``servo-serve robots api-key`` (what it prints, once)."""
    capsys.readouterr()
    assert robots_cli(["api-key", name], Console(live=False)) == 0
    return capsys.readouterr().out.strip()


@asynccontextmanager
async def keyed_door(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[PolicyServer, int, str]]:
    """A door off loopback (wss, API keys), its port, and a key of ``lab-pc`` for it."""
    key = api_key("lab-pc", capsys)
    async with door(door_manifest("0.0.0.0:0")) as (server, _, port):
        tls = server.manifest.frontends.openpi
        assert tls is not None
        monkeypatch.setenv("SSL_CERT_FILE", tls.certificate)  # what an openpi user does with the copied certificate
        yield server, port, key


@pytest.mark.wildcard
async def test_off_loopback_a_stranger_is_refused_and_a_keyed_client_served_over_wss(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with keyed_door(capsys, monkeypatch) as (server, port, key):
        assert server.manifest.frontends.openpi is not None
        assert server.manifest.frontends.openpi.certificate  # wss://

        def stranger(uri: str, key: str | None) -> int:
            with pytest.raises(InvalidStatus) as refused:
                WebsocketClientPolicy(uri, port, api_key=key)
            return refused.value.response.status_code

        assert await blocking(stranger, "wss://127.0.0.1", None) == 401
        assert await blocking(stranger, "wss://127.0.0.1", key.replace(key[-6:], "AAAAAA")) == 401
        assert server.registry.snapshot() == []  # the strangers never held a session

        def keyed() -> float:
            client = WebsocketClientPolicy("wss://127.0.0.1", port, api_key=key)
            try:
                return float(client.infer(aloha_obs(3.0))["actions"][0][0])
            finally:
                client._ws.close()

        assert await blocking(keyed) == pytest.approx(3.0)


def test_off_loopback_plain_ws_needs_insecure_and_keys_need_allow_any_robot() -> None:
    manifest = door_manifest("0.0.0.0:0")  # not through servo-serve: no certificate
    assert manifest.frontends.openpi is not None
    gate = OpenpiGate(manifest.frontends.openpi, manifest.limits, insecure=False, any_client=False)
    with pytest.raises(ConfigError, match=r"frontends\.openpi\.listen: '0\.0\.0\.0:0' is not loopback.*--insecure"):
        gate.ssl_context()
    insecure = OpenpiGate(manifest.frontends.openpi, manifest.limits, insecure=True, any_client=False)
    assert insecure.ssl_context() is None
    assert insecure.keys_required
    assert not OpenpiGate(manifest.frontends.openpi, manifest.limits, insecure=True, any_client=True).keys_required


async def test_openpi_clients_never_take_a_robots_slot() -> None:
    """Clients fill the door's own capacity (4 connections); the robots' two slots stay theirs."""
    manifest = door_manifest("127.0.0.1:0", serving="max_sessions = 2")
    async with door(manifest) as (server, ready, port):
        clients = [await blocking(WebsocketClientPolicy, "127.0.0.1", port) for _ in range(4)]

        def fifth() -> int:
            with pytest.raises(InvalidStatus) as refused:
                WebsocketClientPolicy("127.0.0.1", port)
            return refused.value.response.status_code

        assert await blocking(fifth) == 503
        zenoh_port = int(server.manifest.zenoh.listen[0].rsplit(":", 1)[1])
        async with connected(zenoh_port, "robot-7") as robot7, connected(zenoh_port, "robot-8") as robot8:
            sessions = [await open_on(robot7, ready), await open_on(robot8, ready)]
            assert server.registry.robots() == 2
            for session in sessions:
                await session.close()
        for client in clients:
            await blocking(client._ws.close)  # off the loop: the server answers the close handshake


def test_servo_serve_puts_a_door_off_loopback_behind_tls(tmp_path: Path) -> None:
    """The CLI's own suggestion (``--openpi-listen 0.0.0.0:PORT``) gets servo's certificate."""
    manifest = door_manifest("0.0.0.0:8000")
    secured, certificate = secure_listen(manifest)
    assert certificate is not None
    assert secured.frontends.openpi is not None
    assert secured.frontends.openpi.certificate == str(certificate.cert)


@pytest.mark.wildcard
async def test_a_revoked_api_key_closes_the_connection_it_opened(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of issue 29: revoking a key stopped new connections only; the open one kept being served."""
    async with keyed_door(capsys, monkeypatch) as (_, port, key):
        client = await blocking(lambda: WebsocketClientPolicy("wss://127.0.0.1", port, api_key=key))
        assert await blocking(lambda: float(client.infer(aloha_obs(3.0))["actions"][0][0])) == pytest.approx(3.0)
        assert robots_cli(["revoke-key", "lab-pc"], Console(live=False)) == 0
        # The server reads the roster within about a second.
        closed = await blocking(served_until_closed, client, 30.0, "the key was revoked")
    assert closed.rcvd is not None
    assert "the API key of 'lab-pc' was revoked" in closed.rcvd.reason
