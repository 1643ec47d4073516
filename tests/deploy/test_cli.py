"""``servo-serve --ray`` and `deploy` refuse bad input in one line, before touching a cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from servo.config import ConfigError
from servo.deploy.ray import RayOptions, actor_options, deploy
from servo.server.manifest import parse_manifest
from tests.server.test_cli import REPO
from tests.support import free_port

MANIFEST = '[model]\nsource = "reference"\n[ops]\nhealth_port = 0\n'
HIDE_RAY = "import sys; sys.modules['ray'] = None; from servo.cli.serve import main; sys.exit(main(sys.argv[1:]))"


def run_serve(tmp_path: Path, *args: str, python: tuple[str, ...] = ("-m", "servo.cli.serve")) -> tuple[int, str]:
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(MANIFEST)
    done = subprocess.run(
        [sys.executable, *python, str(manifest), *args], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return done.returncode, lines[0]


def test_ray_flags_without_ray_are_refused(tmp_path: Path) -> None:
    assert run_serve(tmp_path, "--replicas", "2", "--ray-num-cpus", "2") == (
        2,
        "servo-serve: error: --replicas, --ray-num-cpus need --ray",
    )


def test_ray_missing_says_how_to_install_it(tmp_path: Path) -> None:
    code, line = run_serve(tmp_path, "--ray", python=("-c", HIDE_RAY))
    assert code == 2
    assert line == "servo-serve: error: --ray needs Ray, which is not installed: pip install 'servo-robotics[ray]'"


def test_no_cluster_at_the_address_exits_1_at_once(tmp_path: Path) -> None:
    port = free_port()
    code, line = run_serve(tmp_path, "--ray", "--ray-address", f"127.0.0.1:{port}")
    assert code == 1
    assert line.startswith(f"servo-serve: error: no Ray cluster at 127.0.0.1:{port}: ")


def test_deploy_refuses_bad_options_and_unshareable_manifests_before_connecting() -> None:
    manifest = parse_manifest(MANIFEST)
    with pytest.raises(ConfigError, match=r"^ray options: replicas = 0: expected int >= 1$"):
        deploy(manifest, replicas=0)
    with pytest.raises(ConfigError, match=r"^ray options: replica: unknown key \(valid: address, "):
        deploy(manifest, replica=2)
    gpu = parse_manifest('[model]\nsource = "reference"\ndevice = "cuda:1"\n')
    with pytest.raises(ConfigError, match=r"^gpu\.toml: model\.device = 'cuda:1': names one GPU"):
        deploy(gpu, manifest_path="gpu.toml", replicas=2)
    with pytest.raises(ConnectionError, match=r"^no Ray cluster at 127\.0\.0\.1:"):
        deploy(manifest, address=f"127.0.0.1:{free_port()}")


def test_a_gpu_per_replica_for_cuda_else_cpus() -> None:
    options = RayOptions(num_cpus=2.0, max_restarts=3)
    gpu = actor_options(parse_manifest('[model]\nsource = "reference"\ndevice = "cuda"\n'), options)
    cpu = actor_options(parse_manifest('[model]\nsource = "reference"\n'), options)
    assert (gpu["num_gpus"], gpu["num_cpus"], gpu["max_restarts"]) == (1, 2.0, 3)
    assert (cpu["num_gpus"], cpu["num_cpus"]) == (0, 2.0)
    assert gpu["scheduling_strategy"] == cpu["scheduling_strategy"] == "SPREAD"
