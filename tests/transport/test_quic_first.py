"""QUIC beside TLS: a server's tls/ listen also answers quic/ at the same port, a robot dials quic/
first and tls/ when QUIC does not answer, and nobody else answering the QUIC port gets the robot.

QUIC is the lossy-link transport (docs/guides/bad-links.md); what a robot derives from its own
``tls/`` endpoint must be exactly as authenticated as that endpoint (the same CA and name check),
never a plain one.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import zenoh

from servo.edge import link
from servo.edge.config import load_edge_config
from servo.router.fleet import parse_fleet
from servo.router.service import router_config
from servo.server.manifest import parse_manifest
from servo.transport import TlsSettings, ZenohSettings, open_zsession, quic_beside, quic_first
from servo.transport.config import QUIC_OPEN_TIMEOUT_MS
from tests.router.harness import Credentials, fleet_toml
from tests.support import running_server
from tests.transport.test_tls import edge_settings, infer_once, make_pki, tls_manifest

pytestmark = pytest.mark.anyio


def tcp_and_udp_port() -> int:
    """A loopback port free for both TCP and UDP now (tls/ and quic/ share its number)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            tcp.bind(("127.0.0.1", 0))
            number = int(tcp.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind(("127.0.0.1", number))
                except OSError:
                    continue
                return number
    raise AssertionError("no port free for both TCP and UDP")


@contextlib.contextmanager
def listener(endpoint: str, cert: str, key: str, *, mode: str = "peer") -> Iterator[zenoh.Session]:
    """A bare Zenoh peer (or router) listening on ``endpoint`` with this certificate (nothing servo on it)."""
    tls = TlsSettings(listen_certificate=cert, listen_private_key=key)
    settings = ZenohSettings(mode=mode, listen=[endpoint], tls=tls, quic_beside_tls=False, shared_memory=False)
    session = zenoh.open(settings.to_config())
    try:
        yield session
    finally:
        session.close()


@contextlib.contextmanager
def robot(settings: ZenohSettings) -> Iterator[zenoh.Session]:
    session = zenoh.open(settings.to_config())
    try:
        yield session
    finally:
        session.close()


def linked_to(session: zenoh.Session) -> set[str]:
    return {str(z) for z in [*session.info.peers_zid(), *session.info.routers_zid()]}


def test_quic_is_derived_only_from_tls_endpoints_and_dialled_first() -> None:
    tls = edge_settings(7447, "ca.pem")
    dialled = quic_first(msgspec.structs.replace(tls, connect=["tls/10.0.0.5:7447", "tcp/10.0.0.6:7000"]))
    assert dialled.connect == ["quic/10.0.0.5:7447", "tls/10.0.0.5:7447", "tcp/10.0.0.6:7000"]
    assert dialled.open_timeout_ms == QUIC_OPEN_TIMEOUT_MS
    assert dialled.tls == tls.tls  # the same CA, name check and client certificate for QUIC
    plain = ZenohSettings(mode="client", connect=["tcp/10.0.0.6:7000"])
    assert quic_first(plain) == plain  # a plain endpoint is never "upgraded" to one without a certificate
    peer = msgspec.structs.replace(tls, mode="peer")
    assert quic_first(peer) == peer  # a peer would link over both at once
    assert quic_beside(["tcp/h:1", "udp/h:2", "ws/h:3", "unixsock-stream//tmp/s"]) == []


def test_the_edge_prefers_quic_unless_told_not_to() -> None:
    on = load_edge_config(flags={"connect": ["tls/10.0.0.5:7447"]}).zenoh_settings()
    assert on.connect == ["quic/10.0.0.5:7447", "tls/10.0.0.5:7447"]
    off = load_edge_config(flags={"connect": ["tls/10.0.0.5:7447"], "prefer_quic": False}).zenoh_settings()
    assert off.connect == ["tls/10.0.0.5:7447"]


def test_a_server_listens_on_quic_beside_tls_but_a_router_does_not(tmp_path: Path) -> None:
    settings = ZenohSettings(listen=["tls/0.0.0.0:7447", "tcp/127.0.0.1:7448"])
    assert settings.listen_endpoints() == ["tls/0.0.0.0:7447", "tcp/127.0.0.1:7448", "quic/0.0.0.0:7447"]
    assert json.loads(settings.to_config().get_json("listen/endpoints"))[-1] == "quic/0.0.0.0:7447"
    off = msgspec.structs.replace(settings, quic_beside_tls=False)
    assert off.listen_endpoints() == ["tls/0.0.0.0:7447", "tcp/127.0.0.1:7448"]
    creds = Credentials(tmp_path)
    fleet = parse_fleet(fleet_toml("mtls", 7447, creds.pki, creds.passwords), origin="fleet.toml", base_dir=tmp_path)
    assert json.loads(router_config(fleet).get_json("listen/endpoints")) == ["tls/127.0.0.1:7447"]


def test_a_robot_dials_quic_before_tls(tmp_path: Path) -> None:
    pki, number = make_pki(tmp_path, "lab"), tcp_and_udp_port()
    with (
        listener(f"quic/127.0.0.1:{number}", pki["server_cert"], pki["server_key"]) as over_quic,
        listener(f"tls/127.0.0.1:{number}", pki["server_cert"], pki["server_key"]) as over_tls,
        robot(quic_first(edge_settings(number, pki["ca"]))) as edge,
    ):
        assert linked_to(edge) == {str(over_quic.info.zid())}
        assert str(over_tls.info.zid()) not in linked_to(edge)


def test_a_robot_falls_back_to_tls_when_nothing_answers_quic(tmp_path: Path) -> None:
    pki, number = make_pki(tmp_path, "lab"), tcp_and_udp_port()
    with listener(f"tls/127.0.0.1:{number}", pki["server_cert"], pki["server_key"]) as over_tls:
        start = time.monotonic()
        with robot(quic_first(edge_settings(number, pki["ca"]))) as edge:
            took = time.monotonic() - start
            assert linked_to(edge) == {str(over_tls.info.zid())}
    # One QUIC dial's timeout, then TLS: far from the 10 s a robot waits for a server at start.
    assert took >= QUIC_OPEN_TIMEOUT_MS / 1000 - 0.5, took


def test_a_rogue_answering_the_quic_port_never_gets_the_robot(tmp_path: Path) -> None:
    """Attack: someone else binds the UDP port the robot derives from its tls/ endpoint (the real
    server listens on TLS only), with a certificate of their own; the robot must not link to it,
    and reaches the real server over TLS instead."""
    pki, rogue_pki, number = make_pki(tmp_path, "lab"), make_pki(tmp_path, "rogue"), tcp_and_udp_port()
    with (
        listener(f"quic/127.0.0.1:{number}", rogue_pki["server_cert"], rogue_pki["server_key"]) as rogue,
        listener(f"tls/127.0.0.1:{number}", pki["server_cert"], pki["server_key"]) as real,
        robot(quic_first(edge_settings(number, pki["ca"]))) as edge,
    ):
        assert linked_to(edge) == {str(real.info.zid())}
        assert linked_to(rogue) == set()


async def test_a_robot_reaches_a_tls_servers_quic_listen_and_is_served(tmp_path: Path) -> None:
    pki, number = make_pki(tmp_path, "lab"), tcp_and_udp_port()
    async with running_server(parse_manifest(tls_manifest(number, pki, mtls=False))):
        quic_only = msgspec.structs.replace(edge_settings(number, pki["ca"]), connect=[f"quic/127.0.0.1:{number}"])
        assert await infer_once(quic_only) == (50, 6)


async def test_mtls_holds_over_quic_too(tmp_path: Path) -> None:
    pki, number = make_pki(tmp_path, "lab"), tcp_and_udp_port()
    async with running_server(parse_manifest(tls_manifest(number, pki, mtls=True))):
        with_cert = edge_settings(number, pki["ca"], cert=pki["client_cert"], key=pki["client_key"])
        assert await infer_once(msgspec.structs.replace(with_cert, connect=[f"quic/127.0.0.1:{number}"])) == (50, 6)
        without = msgspec.structs.replace(
            edge_settings(number, pki["ca"]), connect=[f"quic/127.0.0.1:{number}"], open_timeout_ms=2000
        )
        with pytest.raises(zenoh.ZError):
            async with open_zsession(without):
                pass


@pytest.mark.parametrize(
    ("mode", "udp", "again"),
    [("router", "", True), ("peer", "", True), ("peer", "quic", False), ("peer", "answers", False)],
    ids=["router", "udp-dropped", "over-quic", "quic-lost-to-loss"],
)
async def test_a_robot_linked_over_tls_dials_again_without_quic_only_where_nothing_answers_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, udp: str, again: bool
) -> None:
    """Zenoh dials QUIC first again at every reconnect: a robot whose QUIC goes unanswered (a
    servo-router listens on TLS only; a firewall may drop UDP) would wait for it at every redial,
    so it opens its session again on TLS alone. One linked over QUIC keeps it, and so does one
    whose QUIC dial failed where something answers QUIC (here: version negotiation packets, as
    a real server's would come back through a lossy link)."""
    pki, number = make_pki(tmp_path, "lab"), tcp_and_udp_port()
    dialled: list[list[str]] = []
    real = link.open_zsession

    def spy(settings: ZenohSettings) -> contextlib.AbstractAsyncContextManager[zenoh.Session]:
        dialled.append(list(settings.connect))
        return real(settings)

    monkeypatch.setattr(link, "open_zsession", spy)
    flags = {"connect": [f"tls/127.0.0.1:{number}"], "tls_root_ca": pki["ca"]}
    endpoints = [f"tls/127.0.0.1:{number}", *([f"quic/127.0.0.1:{number}"] if udp == "quic" else [])]
    tls = TlsSettings(listen_certificate=pki["server_cert"], listen_private_key=pki["server_key"])
    settings = ZenohSettings(mode=mode, listen=endpoints, tls=tls, quic_beside_tls=False, shared_memory=False)
    with (
        contextlib.closing(zenoh.open(settings.to_config())) as remote,
        negotiator(number) if udp == "answers" else contextlib.nullcontext(),
    ):
        async with contextlib.AsyncExitStack() as stack:
            zsession = await link.open_link(load_edge_config(flags=flags), stack)
            assert linked_to(zsession) == {str(remote.info.zid())}
            (used,) = [str(used.dst) for used in zsession.info.links()]
    assert used.startswith("quic/" if udp == "quic" else "tls/")
    first = [f"quic/127.0.0.1:{number}", f"tls/127.0.0.1:{number}"]
    assert dialled == [first, [f"tls/127.0.0.1:{number}"]] if again else [first]


def test_a_real_quic_listen_answers_the_probe_and_a_silent_port_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki, number = make_pki(tmp_path, "lab"), tcp_and_udp_port()
    with (
        listener(f"quic/127.0.0.1:{number}", pki["server_cert"], pki["server_key"]),
        monkeypatch.context() as patient,
    ):
        patient.setattr(link, "_PROBE_WAIT_S", 5.0)  # the answer is what is tested, not a loaded host's speed
        assert link._quic_answers([f"quic/127.0.0.1:{number}"])
    assert not link._quic_answers([f"quic/127.0.0.1:{tcp_and_udp_port()}"])


@contextlib.contextmanager
def negotiator(number: int) -> Iterator[None]:
    """A UDP port that answers every datagram with a QUIC version negotiation packet (RFC 9000 §17.2.1)."""
    stop = threading.Event()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", number))
        udp.settimeout(0.1)

        def answer() -> None:
            while not stop.is_set():
                try:
                    packet, peer = udp.recvfrom(2048)
                except TimeoutError:
                    continue
                ids = packet[5 : 6 + packet[5]]
                udp.sendto(bytes([0x80]) + bytes(4) + ids + bytes([0]) + bytes.fromhex("ff00001d"), peer)

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(5)
