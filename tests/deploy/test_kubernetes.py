"""deploy/kubernetes: every resource valid against the Kubernetes schemas (kubernetes-validate, strict,
the oldest and newest versions it knows), clean YAML (yamllint), and what servo itself reads from
them (the manifest with the container's arguments, the fleet file) accepted by servo, with the
ports, mounts and timeouts agreeing. No cluster runs here."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from yamllint import linter
from yamllint.config import YamlLintConfig

from servo.cli.serve import build_parser, read_manifest
from servo.router import load_fleet
from servo.server.service import DRAIN_TIMEOUT_S
from tests.pki import Pki

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
FILES = sorted(KUBERNETES.glob("*.yaml")) + sorted((KUBERNETES / "example-secrets").glob("*.yaml"))
#: The oldest Kubernetes the schemas cover that is still common, and the newest they know.
VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]
#: The uid the images run as (deploy/container/Containerfile).
SERVO_UID = 10001
POD = "servo-replicas-6d9c8b7f5-x2x9z"


def resources() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in FILES:
        for document in yaml.safe_load_all(path.read_text()):
            out[document["kind"], document["metadata"]["name"]] = document
    return out


def container(resource: dict[str, Any], name: str, *, init: bool = False) -> dict[str, Any]:
    spec = resource["spec"]["template"]["spec"]
    return next(c for c in spec["initContainers" if init else "containers"] if c["name"] == name)


def mounts(resource: dict[str, Any], mounting: dict[str, Any]) -> dict[str, str]:
    """Mount path -> what is mounted there in container ``mounting`` (a ConfigMap or Secret name, or
    the volume's name)."""
    volumes = {v["name"]: v for v in resource["spec"]["template"]["spec"]["volumes"]}
    out = {}
    for mount in mounting["volumeMounts"]:
        volume = volumes[mount["name"]]
        source = volume.get("configMap", {}).get("name") or volume.get("secret", {}).get("secretName")
        out[mount["mountPath"]] = source or mount["name"]
    return out


class ContainerRoot:
    """The container's paths under a test directory, holding the files the cluster would mount."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __call__(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def rebase(self, text: str) -> str:
        for top in ("/etc/servo", "/var/lib/servo"):
            text = text.replace(top, str(self(top)))
        return text

    def write(self, path: str, text: str) -> None:
        self(path).parent.mkdir(parents=True, exist_ok=True)
        self(path).write_text(text)


@pytest.fixture
def cluster(tmp_path: Path) -> tuple[dict[tuple[str, str], dict[str, Any]], ContainerRoot]:
    """The resources, and a root holding what the ConfigMaps and real Secrets would put in place."""
    found, root = resources(), ContainerRoot(tmp_path / "root")
    root.write("/etc/servo/fleet/fleet.toml", root.rebase(found["ConfigMap", "servo-fleet"]["data"]["fleet.toml"]))
    pki = Pki(tmp_path / "pki")
    for name, directory in (("router", "/etc/servo/certs"), ("replica", "/etc/servo/certs")):
        leaf = pki.issue(name)
        root.write(f"{directory}/{name}.pem", Path(leaf.cert).read_text())
        root.write(f"{directory}/{name}.key", Path(leaf.key).read_text())
    root.write("/etc/servo/certs/ca.pem", Path(pki.ca).read_text())
    return found, root


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(KUBERNETES)))
def test_every_resource_is_valid_against_the_kubernetes_schemas(path: Path, version: str) -> None:
    documents = list(yaml.safe_load_all(path.read_text()))
    assert documents
    for document in documents:
        kubernetes_validate.validate(document, version, strict=True)


def test_the_yaml_is_clean() -> None:
    assert {path.name for path in FILES} == {"replicas.yaml", "router.yaml", "secrets.yaml"}
    config = YamlLintConfig("{extends: default, rules: {line-length: {max: 120}, braces: {max-spaces-inside: 1}}}")
    problems = [f"{path.name}:{p.line}: {p.desc}" for path in FILES for p in linter.run(path.read_text(), config)]
    assert problems == []


def test_the_replicas_run_what_servo_serve_accepts(cluster: tuple[dict[Any, Any], ContainerRoot]) -> None:
    found, root = cluster
    deployment = found["Deployment", "servo-replicas"]
    serve = container(deployment, "servo-serve")
    root.write("/etc/servo/manifest.toml", root.rebase(found["ConfigMap", "servo-manifest"]["data"]["manifest.toml"]))
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in serve["env"]
    args = [root.rebase(arg).replace("$(POD_NAME)", POD) for arg in serve["args"]]
    manifest = read_manifest(build_parser().parse_args(args))

    assert (manifest.zenoh.mode, manifest.zenoh.listen, manifest.serving.replica) == ("client", [], POD)
    router = found["Service", "servo-router"]["spec"]["ports"][0]["port"]
    assert manifest.zenoh.connect == [f"tls/servo-router:{router}"]
    assert manifest.model.device == "cuda"
    assert serve["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # What is mounted where is what the manifest reads.
    where = mounts(deployment, serve)
    assert where["/etc/servo/manifest.toml"] == "servo-manifest"
    assert where["/etc/servo/fleet"] == "servo-fleet"
    assert where["/etc/servo/certs"] == "servo-replica-certs"
    assert manifest.security.fleet == str(root("/etc/servo/fleet/fleet.toml"))
    tls = manifest.zenoh.tls
    assert tls is not None
    assert tls.enable_mtls
    # The identity: the init container copies the Secret's key to the file the manifest names, 0600.
    init = container(deployment, "identity", init=True)
    assert init["command"][:3] == ["install", "-m", "0600"]
    assert root.rebase(init["command"][-1]) == manifest.security.identity_key
    assert mounts(deployment, init)["/run/secrets/servo"] == "servo-server-identity"
    assert where[str(Path(init["command"][-1]).parent)] == "identity"  # the pod's volume, shared
    # Health, metrics and the drain.
    port = next(p for p in serve["ports"] if p["name"] == "ops")["containerPort"]
    assert manifest.ops.health_port == port
    assert manifest.ops.health_host == "0.0.0.0"
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert serve[probe]["httpGet"] == {"path": "/healthz", "port": "ops"}
    liveness = serve["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] > DRAIN_TIMEOUT_S  # a drain answers 503
    spec = deployment["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] > DRAIN_TIMEOUT_S
    assert "kill -TERM 1" in shlex.join(serve["lifecycle"]["preStop"]["exec"]["command"])
    assert spec["securityContext"]["runAsUser"] == SERVO_UID
    assert spec["securityContext"]["runAsNonRoot"] is True


def test_the_disruption_budget_covers_the_replicas() -> None:
    found = resources()
    labels = found["Deployment", "servo-replicas"]["spec"]["template"]["metadata"]["labels"]
    budget = found["PodDisruptionBudget", "servo-replicas"]["spec"]
    assert budget["selector"]["matchLabels"].items() <= labels.items()
    assert budget["maxUnavailable"] == 1


def test_the_router_runs_the_fleet_file_servo_router_accepts(cluster: tuple[dict[Any, Any], ContainerRoot]) -> None:
    found, root = cluster
    deployment = found["Deployment", "servo-router"]
    router = container(deployment, "servo-router")
    assert router["command"][0] == "servo-router"
    fleet = load_fleet(root.rebase(router["command"][1]))
    assert fleet.identified_by == "cert_common_names"
    assert fleet.count("servers") >= 1
    where = mounts(deployment, router)
    assert where["/etc/servo/fleet"] == "servo-fleet"
    assert where["/etc/servo/certs"] == "servo-router-certs"
    port = fleet.router.listen[0].rsplit(":", 1)[1]
    assert [p["containerPort"] for p in router["ports"]] == [int(port)]
    service = found["Service", "servo-router"]["spec"]
    assert service["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert service["ports"][0]["targetPort"] == router["ports"][0]["name"]
