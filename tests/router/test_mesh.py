"""Two routers joined into a mesh (mTLS: each router names the other by its certificate): members on
either side reach each other, and each router keeps enforcing the fleet file on its own members."""

from __future__ import annotations

from pathlib import Path

from servo.wire import ServerKeys
from tests.router.harness import (
    Auth,
    Credentials,
    FakeServer,
    Inbox,
    Net,
    action_publisher,
    fleet_toml,
    obs_publisher,
    replies,
    tokens,
    wait_matching,
)
from tests.support import free_port

KEYS = ServerKeys("lab", "act", "r1")
ROBOT7, ROBOT8 = KEYS.client("robot-7"), KEYS.client("robot-8")


def _router(auth: Auth, creds: Credentials, tmp: Path, name: str, **kw: tuple[str, ...]) -> Net:
    port = free_port()
    path = tmp / f"{name}.toml"
    path.write_text(fleet_toml(auth, port, creds.pki, creds.passwords, name=name, **kw))
    return Net(auth, creds, path, port)


def test_robots_on_one_router_use_a_server_on_another(creds: Credentials, tmp_path: Path) -> None:
    a = _router("mtls", creds, tmp_path, "router-a", peers=("router-b",))
    try:
        b = _router("mtls", creds, tmp_path, "router-b", connect=(f"127.0.0.1:{a.port}",), peers=("router-a",))
        try:
            server = FakeServer(b.join("gpu-0"), KEYS)
            a.wait_token(KEYS.alive)  # the server's declarations crossed the mesh
            r7, r8 = a.join("robot-7"), a.join("robot-8")
            chunks, sniffed = Inbox(), Inbox()
            r7.declare_subscriber(ROBOT7.action, chunks.samples())
            r8.declare_subscriber(ROBOT7.action, sniffed.samples())  # denied by router-a
            r8.declare_subscriber(ROBOT8.action, sniffed.samples())

            obs = obs_publisher(r7, ROBOT7.obs)
            wait_matching(obs)
            obs.put(b"obs")
            server.obs.wait_for((ROBOT7.obs, b"obs"))
            assert replies(r7, "@servo/*/*/*/status") == [(KEYS.status, b"r1")]
            assert tokens(r7, "@servo/*/*/*/alive") == [KEYS.alive]

            to_7, to_8 = (action_publisher(server.z, k.action) for k in (ROBOT7, ROBOT8))
            wait_matching(to_7)
            wait_matching(to_8)
            to_7.put(b"chunk-for-7")
            to_8.put(b"chunk-for-8")
            chunks.wait_for((ROBOT7.action, b"chunk-for-7"))
            assert sniffed.wait_for((ROBOT8.action, b"chunk-for-8")) == [(ROBOT8.action, b"chunk-for-8")]
            assert replies(r8, ROBOT7.control) == []
        finally:
            b.close()
    finally:
        a.close()
