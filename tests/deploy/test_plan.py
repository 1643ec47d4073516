"""What each replica runs with: stable ids, its own ports and files, paths that resolve anywhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from servo.config import ConfigError
from servo.deploy.plan import replica_base, replica_manifests
from servo.server.manifest import parse_manifest


def manifest(extra: str = "", *, model: str = 'source = "reference"') -> str:
    return f"[model]\n{model}\n{extra}"


def test_replica_ids_are_stem_and_index_and_stable() -> None:
    m = parse_manifest(manifest())
    first = [r.serving.replica for r in replica_manifests(m, 3, cwd=Path("/srv"))]
    again = [r.serving.replica for r in replica_manifests(m, 3, cwd=Path("/srv"))]
    assert first == again == ["reference-0", "reference-1", "reference-2"]
    named = parse_manifest(manifest('[serving]\nreplica = "gpu-pool"'))
    assert [r.serving.replica for r in replica_manifests(named, 2, cwd=Path("/srv"))] == ["gpu-pool-0", "gpu-pool-1"]


def test_replica_stem_of_a_factory_source_is_a_safe_key_segment() -> None:
    m = parse_manifest(manifest(model='source = "my_pkg.policies:make_act"'))
    assert replica_base(m) == "my_pkg.policies-make_act"
    long = parse_manifest(manifest(model=f'source = "{"p" * 200}:f"'))
    ids = [r.serving.replica for r in replica_manifests(long, 12, cwd=Path("/srv"))]
    assert all(len(i) <= 128 for i in ids)
    assert len(set(ids)) == 12


def test_fixed_ports_shift_by_index_and_port_zero_stays() -> None:
    m = parse_manifest(
        manifest(
            '[zenoh]\nlisten = ["tcp/127.0.0.1:7447", "tcp/[::1]:7500#iface=lo", "tcp/127.0.0.1:0"]\n'
            "[ops]\nhealth_port = 9100\n"
            '[frontends.openpi]\nlisten = "[::1]:8000"\n'
        )
    )
    r0, r1, r2 = replica_manifests(m, 3, cwd=Path("/srv"))
    assert r0.zenoh.listen == ["tcp/127.0.0.1:7447", "tcp/[::1]:7500#iface=lo", "tcp/127.0.0.1:0"]
    assert r2.zenoh.listen == ["tcp/127.0.0.1:7449", "tcp/[::1]:7502#iface=lo", "tcp/127.0.0.1:0"]
    assert [r.ops.health_port for r in (r0, r1, r2)] == [9100, 9101, 9102]
    openpi = [r.frontends.openpi for r in (r0, r1, r2)]
    assert [o.listen for o in openpi if o is not None] == ["[::1]:8000", "[::1]:8001", "[::1]:8002"]


def test_one_replica_keeps_the_manifest_ports() -> None:
    m = parse_manifest(manifest('[zenoh]\nlisten = ["tcp/127.0.0.1:7447"]\n[ops]\nhealth_port = 9100\n'))
    (only,) = replica_manifests(m, 1, cwd=Path("/srv"))
    assert (only.zenoh.listen, only.ops.health_port, only.serving.replica) == (
        ["tcp/127.0.0.1:7447"],
        9100,
        "reference-0",
    )


def test_client_mode_replicas_share_the_router_endpoints() -> None:
    m = parse_manifest(manifest('[zenoh]\nmode = "client"\nlisten = []\nconnect = ["tls/10.0.0.1:7447"]\n'))
    assert {tuple(r.zenoh.connect) for r in replica_manifests(m, 4, cwd=Path("/srv"))} == {("tls/10.0.0.1:7447",)}


def test_each_replica_audits_to_its_own_file_and_relative_paths_become_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the manifest's relative paths are checked where it is read
    (tmp_path / "ca.pem").write_text("")
    (tmp_path / "wave.jsonl").write_text("")
    m = parse_manifest(
        manifest(
            '[zenoh]\nmode = "client"\nlisten = []\nconnect = ["tls/router:7447"]\n'
            '[zenoh.tls]\nroot_ca_certificate = "ca.pem"\n'
            '[ops]\naudit_log = "logs/audit.jsonl"\n'
            '[[trajectories]]\nname = "wave"\npath = "wave.jsonl"\n'
        )
    )
    r0, r1 = replica_manifests(m, 2, cwd=tmp_path)
    assert r0.ops.audit_log == str(tmp_path / "logs" / "audit.reference-0.jsonl")
    assert r1.ops.audit_log == str(tmp_path / "logs" / "audit.reference-1.jsonl")
    assert r0.zenoh.tls is not None
    assert r0.zenoh.tls.root_ca_certificate == str(tmp_path / "ca.pem")
    assert r0.trajectories[0].path == str(tmp_path / "wave.jsonl")
    assert m.ops.audit_log == "logs/audit.jsonl"  # the deploying process's manifest is left alone


def test_audit_to_stdout_is_shared() -> None:
    m = parse_manifest(manifest('[ops]\naudit_log = "-"\n'))
    assert {r.ops.audit_log for r in replica_manifests(m, 2, cwd=Path("/srv"))} == {"-"}


REFUSED = {
    "one gpu named": (
        '[model]\nsource = "reference"\ndevice = "cuda:1"\n',
        2,
        "manifest.toml: model.device = 'cuda:1': names one GPU",
    ),
    "no port to shift": (
        '[model]\nsource = "reference"\n[zenoh]\nlisten = ["unixsock-stream//tmp/servo.sock"]\n',
        2,
        "manifest.toml: zenoh.listen = 'unixsock-stream//tmp/servo.sock': has no port",
    ),
    "ports past 65535": (
        '[model]\nsource = "reference"\n[zenoh]\nlisten = ["tcp/127.0.0.1:65535"]\n[ops]\nhealth_port = 0\n',
        2,
        "manifest.toml: zenoh.listen = 65535: leaves no room for 2 consecutive ports",
    ),
}


@pytest.mark.parametrize(("text", "replicas", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_manifests_replicas_cannot_share_are_refused_naming_the_key(text: str, replicas: int, message: str) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        replica_manifests(parse_manifest(text), replicas, cwd=Path("/srv"), origin="manifest.toml")


def test_cuda_without_index_is_placed_by_the_cluster() -> None:
    m = parse_manifest('[model]\nsource = "reference"\ndevice = "cuda"\n')
    assert {r.model.device for r in replica_manifests(m, 2, cwd=Path("/srv"))} == {"cuda"}


def test_replicas_print_no_join_token_of_their_own() -> None:
    m = parse_manifest(manifest(""))
    assert m.security.join_token_ttl_s > 0
    assert {r.security.join_token_ttl_s for r in replica_manifests(m, 2, cwd=Path("/srv"))} == {0.0}
