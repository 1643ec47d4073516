"""The edge commands servo-serve prints, and the self-signed certificate a TLS listen gets."""

from __future__ import annotations

import shlex
import socket
from pathlib import Path

import pytest

from servo.cli.listen import arm_options, edge_command, secure_listen
from servo.join import JoinToken
from servo.server.manifest import parse_manifest
from servo.server.selfsigned import ensure_certificate, primary_address, public_key_pin
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
        fps=50,
        buffer_time_s=0.65,
        options=arm_options(cameras=["front", "wrist"], units=["range_m100_100"] * 5 + ["range_0_100"]),
    )
    assert arm is not None
    assert shlex.split(arm) == [
        "servo-edge",
        "--robot",
        "so101",
        *("--robot-opt", "port=PORT", "--robot-opt", "id=ARM"),
        *("--robot-opt", "cameras=front:DEVICE,wrist:DEVICE", "--robot-opt", "use_degrees=false"),
        *("--robot-opt", "fps=50", "--buffer-time-s", "0.65"),
        *("--connect", "tls/10.1.2.3:7447", "--tls-root-ca", "server.pem"),
    ]
    # The robots' own rate needs no option, nor one the options already set.
    assert edge_command("tcp/127.0.0.1:7447", robot="sim", certificate=None, fps=30) == (
        "servo-edge --robot sim --connect tcp/127.0.0.1:7447"
    )
    ros2 = edge_command("tcp/127.0.0.1:7447", robot="ros2", certificate=None, fps=15, options={"fps": "100"})
    assert ros2 == "servo-edge --robot ros2 --robot-opt fps=100 --connect tcp/127.0.0.1:7447"


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


def test_with_a_join_token_the_robot_fetches_the_certificate_itself(tmp_path: Path) -> None:
    certificate = ensure_certificate(tmp_path)
    token = str(JoinToken.issue(bytes(32), public_key_pin(certificate.cert.read_bytes())))
    command = edge_command("tls/10.1.2.3:7447", robot="sim", certificate=certificate, join=token)
    assert command is not None
    assert shlex.split(command) == ["servo-edge", "--robot", "sim", "--connect", "tls/10.1.2.3:7447", "--join", token]
    # A token that pins no certificate (a fleet CA's listen) says nothing the robot could dial with.
    bare = str(JoinToken.issue(bytes(32)))
    assert edge_command("tls/10.1.2.3:7447", robot="sim", certificate=None, join=bare) is None


def test_an_openpi_door_off_loopback_gets_the_certificate_unless_insecure(servo_config_dir: Path) -> None:
    door = '[frontends.openpi]\nlisten = "0.0.0.0:8000"\n'
    manifest, certificate = secure_listen(parse_manifest(MANIFEST.format(listen='"tcp/127.0.0.1:7447"', tls=door)))
    assert certificate is not None
    assert manifest.frontends.openpi is not None
    assert manifest.frontends.openpi.certificate == str(certificate.cert)
    insecure = parse_manifest(
        MANIFEST.format(listen='"tcp/127.0.0.1:7447"', tls=door + "[security]\ninsecure = true\n")
    )
    assert secure_listen(insecure) == (insecure, None)
