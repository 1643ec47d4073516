"""The edge commands servo-serve prints, and the self-signed certificate a TLS listen gets."""

from __future__ import annotations

import shlex
import socket
from pathlib import Path

import pytest

from servo.cli.listen import edge_command, robot_options, secure_listen
from servo.server.manifest import parse_manifest
from servo.server.selfsigned import ensure_certificate, primary_address
from servo.transport import exposed_endpoint

MANIFEST = '[model]\nsource = "reference"\n[zenoh]\nlisten = [{listen}]\n{tls}'


@pytest.mark.parametrize("protocol", ["tls", "quic"])
def test_a_tls_or_quic_listen_without_certificate_gets_the_self_signed_one(
    servo_config_dir: Path, protocol: str
) -> None:
    listen = f'"{protocol}/127.0.0.1:7447"'
    manifest, certificate = secure_listen(parse_manifest(MANIFEST.format(listen=listen, tls="")))
    assert certificate is not None
    assert certificate.cert == servo_config_dir / "tls" / "server.pem"
    assert manifest.zenoh.tls is not None
    assert (manifest.zenoh.tls.listen_certificate, manifest.zenoh.tls.listen_private_key) == (
        str(certificate.cert),
        str(certificate.key),
    )


def test_a_configured_certificate_or_a_tcp_listen_is_left_alone(servo_config_dir: Path, tmp_path: Path) -> None:
    mine = ensure_certificate(tmp_path)
    tls = f'[zenoh.tls]\nlisten_certificate = "{mine.cert}"\nlisten_private_key = "{mine.key}"\n'
    configured = parse_manifest(MANIFEST.format(listen='"tls/127.0.0.1:7447"', tls=tls))
    assert secure_listen(configured) == (configured, None)
    plain = parse_manifest(MANIFEST.format(listen='"tcp/127.0.0.1:7447"', tls=""))
    assert secure_listen(plain) == (plain, None)
    assert not servo_config_dir.exists()


def test_edge_commands_name_what_the_robot_must_match(tmp_path: Path) -> None:
    certificate = ensure_certificate(tmp_path)
    arm = edge_command(
        "tls/10.1.2.3:7447",
        robot="so101",
        certificate=certificate,
        options=robot_options(cameras=["front", "wrist"], fps=50, sim=False),
    )
    assert arm is not None
    assert shlex.split(arm) == [
        "servo-edge",
        "--robot",
        "so101",
        *("--robot-opt", "port=PORT", "--robot-opt", "id=ARM"),
        *("--robot-opt", "cameras=front:DEVICE,wrist:DEVICE", "--robot-opt", "fps=50"),
        *("--connect", "tls/10.1.2.3:7447", "--tls-root-ca", "server.pem"),
    ]
    # The sim's own cameras need no option; others are named.
    assert "cameras" not in " ".join(robot_options(cameras=["front"], fps=30, sim=True))
    assert robot_options(cameras=["laptop"], fps=30, sim=True) == ["--robot-opt", "cameras=laptop"]


def test_hosts_an_edge_can_dial() -> None:
    wildcard = edge_command("tcp/0.0.0.0:7447", robot="sim", certificate=None)
    assert wildcard is not None
    args = shlex.split(wildcard)
    connect = args[args.index("--connect") + 1]
    dialled = connect.removeprefix("tcp/").rpartition(":")[0]
    assert dialled == str(primary_address(socket.AF_INET) or socket.gethostname())
    # Plain text to another host: the server had to be told --insecure, and so must the edge.
    assert ("--insecure" in args) == exposed_endpoint(connect)
    assert edge_command("tcp/[::1]:7447", robot="sim", certificate=None) == (
        "servo-edge --robot sim --connect 'tcp/[::1]:7447'"
    )
    # Nothing to say for a TLS listen with a CA of the user's own, or a port chosen at bind time.
    assert edge_command("tls/10.1.2.3:7447", robot="sim", certificate=None) is None
    assert edge_command("quic/10.1.2.3:7447", robot="sim", certificate=None) is None
    assert edge_command("tcp/127.0.0.1:0", robot="sim", certificate=None) is None
