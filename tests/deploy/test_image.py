"""The container images, built and run here (``make test-image``; minutes, so marked ``image``).

Once per run: a Debian bookworm base made with debootstrap (no registry is needed), then
``make image`` on it (both images, as a user builds them). The server image then runs with host
networking, the manifest and the identity mounted; ``servo-edge --robot sim`` on the host drives a
robot through it, and so does the edge image; the server runs as a non-root user and drains on
SIGTERM (exit 0). podman runs the containers with runc (``CONTAINERS_CONF``: crun cannot set the
rlimits podman asks for on some hosts) and builds them with chroot isolation (``BUILDAH_ISOLATION``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from servo.identity import load_identity
from tests.edge.harness import run_edge, write_manifest
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]
BASE = "localhost/servo-base:bookworm"
TAG = "test"
SERVER, EDGE = f"localhost/servo-server:{TAG}", f"localhost/servo-edge:{TAG}"
MIRROR = os.environ.get("SERVO_DEBIAN_MIRROR", "http://deb.debian.org/debian")
TOOLS = ("podman", "runc", "debootstrap")
#: Building both images from nothing (the Rust toolchain, the wheel, torch) takes minutes.
BUILD_TIMEOUT_S = 2400
#: Free disk a cold build needs where podman keeps layers and writes them: torch's layer (~6 GB)
#: is stored once and copied once while it is committed, beside the Rust toolchain's stage.
BUILD_DISK_GB = 20

pytestmark = [
    pytest.mark.image,
    pytest.mark.timeout(BUILD_TIMEOUT_S + 600),
    pytest.mark.skipif(
        not all(shutil.which(tool, path=f"{os.environ.get('PATH', '')}:/usr/sbin") for tool in TOOLS),
        reason="needs podman, runc and debootstrap (make image-tools installs them)",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="debootstrap and the host-network containers need root"),
]


@dataclass(frozen=True)
class Podman:
    """podman with this test's settings; the environment also reaches ``make image``."""

    env: dict[str, str]

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=check
        )


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n')
    return Podman({**os.environ, "CONTAINERS_CONF": str(conf), "BUILDAH_ISOLATION": "chroot"})


def stage(what: str, started: float) -> None:
    print(f"\n{what}: {time.monotonic() - started:.0f} s", file=sys.stderr)


@pytest.fixture(scope="session")
def images(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The base image (once per run), then both images with ``make image``; build times and sizes printed."""
    if podman("image", "exists", BASE, check=False).returncode != 0:
        started = time.monotonic()
        rootfs = tmp_path_factory.mktemp("rootfs")
        subprocess.run(
            ["debootstrap", "--variant=minbase", "bookworm", str(rootfs), MIRROR],
            capture_output=True,
            check=True,
            timeout=900,
        )
        with subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE) as tar:
            command = ["podman", "import", "-", BASE]
            imported = subprocess.run(command, stdin=tar.stdout, env=podman.env, capture_output=True, check=False)
        assert imported.returncode == 0, imported.stderr
        assert tar.returncode == 0
        shutil.rmtree(rootfs)
        stage(f"base image {BASE} (debootstrap)", started)
    for where in (podman("info", "--format", "{{.Store.GraphRoot}}").stdout.strip(), "/var/tmp"):
        free_gb = shutil.disk_usage(where).free / 1e9
        assert free_gb >= BUILD_DISK_GB, f"make image needs {BUILD_DISK_GB} GB free in {where}; it has {free_gb:.0f}"
    try:
        build_images(podman, tmp_path_factory.mktemp("build") / "make-image.log")
        yield
    finally:
        # The images, then every dangling layer a servo build left (each stage carries the label):
        # a full build is ~10 GB of layers, and runs on one host would otherwise pile them up.
        for image in (SERVER, EDGE):
            podman("rmi", "--force", image, check=False)
        podman("image", "prune", "--force", "--filter", "label=io.servo.image", timeout=300, check=False)


def build_images(podman: Podman, log: Path) -> None:
    """Both images with ``make image``, as a user builds them; its stage times and sizes printed."""
    started = time.monotonic()
    with log.open("w") as out:
        built = subprocess.run(
            ["make", "--no-print-directory", "image", f"IMAGE_BASE={BASE}", f"IMAGE_TAG={TAG}", "CONTAINER=podman"],
            cwd=ROOT,
            env=podman.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    text = log.read_text()
    assert built.returncode == 0, text[-6000:]
    stage("make image", started)
    print("\n".join(line for line in text.splitlines() if re.match(r"(==>|    done in|localhost/servo-)", line)))


@pytest.fixture
def server(images: None, podman: Podman, tmp_path: Path) -> Iterator[tuple[str, int, int]]:
    """The server image running with host networking; yields (container, zenoh port, health port)."""
    port, health = free_port(), free_port()
    identity_key = 'identity_key = "/var/lib/servo/identity/server.key"'
    manifest = write_manifest(tmp_path / "manifest.toml", port, extra=f"[security]\n{identity_key}")
    identity = tmp_path / "identity"
    identity.mkdir()
    load_identity(identity / "server.key")
    name = f"servo-test-{port}"
    podman(
        "run", "--detach", "--name", name, "--network", "host",
        "--volume", f"{manifest}:/etc/servo/manifest.toml:ro",
        "--volume", f"{identity}:/var/lib/servo/identity:U",
        SERVER, "/etc/servo/manifest.toml", "--health-port", str(health),
    )  # fmt: skip
    try:
        yield name, port, health
    finally:
        podman("rm", "--force", name, check=False)


def healthy(port: int, container: str, podman: Podman, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        if podman("inspect", "--format", "{{.State.Running}}", container).stdout.strip() != "true":
            break
        time.sleep(0.5)
    raise AssertionError(f"no healthy server; its log:\n{podman('logs', container, check=False).stderr[-4000:]}")


def test_the_server_image_serves_a_robot_runs_as_non_root_and_drains(
    server: tuple[str, int, int], podman: Podman, tmp_path: Path
) -> None:
    name, port, health = server
    healthy(health, name, podman)
    assert podman("exec", name, "id", "-u").stdout.strip() == "10001"

    # A robot on the host, through the container's loopback endpoint.
    summary = tmp_path / "host.json"
    host = run_edge(f"--robot sim --connect tcp/127.0.0.1:{port} --duration 4 --summary {summary}", timeout=120)
    assert host.returncode == 0, host.stdout + host.stderr
    assert json.loads(summary.read_text())["chunks_received"] > 0

    # The edge image: the same robot from a container; it holds no torch.
    out = tmp_path / "edge"
    out.mkdir()
    edge = podman(
        "run", "--rm", "--network", "host", "--volume", f"{out}:/out:U", EDGE,
        "--robot", "sim", "--connect", f"tcp/127.0.0.1:{port}", "--duration", "4", "--summary", "/out/run.json",
        "--no-status",
        timeout=180, check=False,
    )  # fmt: skip
    assert edge.returncode == 0, edge.stdout + edge.stderr
    assert json.loads((out / "run.json").read_text())["chunks_received"] > 0
    probe = "import importlib.util as u; print(u.find_spec('torch') is None)"
    assert podman("run", "--rm", "--entrypoint", "python3", EDGE, "-c", probe).stdout.strip() == "True"

    # SIGTERM (podman stop): the server drains and exits 0.
    podman("stop", "--time", "60", name, timeout=90)
    assert podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip() == "0"
    logs = podman("logs", name)
    assert "drained" in logs.stdout + logs.stderr
