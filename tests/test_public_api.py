"""The public API: ``servo.X`` (httpx-style), a snapshot of its names, and ``import servo`` stays light.

Adding or removing a public name is a decision: this snapshot changes with it, in the same commit.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import servo
from tests.support import free_port

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "python" / "servo"

SERVO = [
    "CalibrationError",
    "CameraError",
    "CameraFeature",
    "CameraSpec",
    "Cameras",
    "ChunkResult",
    "ClientError",
    "ConfigError",
    "ControlConfig",
    "DecodedObservation",
    "ENGINES",
    "EdgeConfig",
    "EdgeRuntime",
    "EdgeStartError",
    "EngineBase",
    "FailSafeConfig",
    "Features",
    "IdentityError",
    "JoinTokenError",
    "LinkConfig",
    "LocalConfig",
    "Manifest",
    "NoServerFound",
    "POLICIES",
    "PipelineConfig",
    "Policy",
    "PolicyClient",
    "PolicyError",
    "PolicyFailed",
    "PolicyLoadError",
    "PolicyOutputError",
    "PolicyServer",
    "PolicySpec",
    "Processor",
    "ProtocolError",
    "ROBOTS",
    "RemoteEngine",
    "RemoteSession",
    "ReplayConfig",
    "ReplayEngine",
    "RequestTimeout",
    "Robot",
    "RobotDescription",
    "RobotError",
    "RobotFault",
    "RobotParts",
    "RobotSpec",
    "RogueServer",
    "RtcEngine",
    "RunOptions",
    "RunSummary",
    "SecurityConfig",
    "SecurityError",
    "SendFailed",
    "ServerConfig",
    "ServerError",
    "ServerInfo",
    "ServerReady",
    "ServoError",
    "SessionEnded",
    "SessionLost",
    "SessionRejected",
    "StartError",
    "SyncEngine",
    "SyncPolicyClient",
    "TlsSettings",
    "TrustedServers",
    "UntrustedServer",
    "WireError",
    "ZenohSettings",
    "__version__",
    "load_edge_config",
    "load_manifest",
    "load_policy",
    "make_engine",
    "make_robot",
    "parse_manifest",
]
SERVER = ["Manifest", "PolicyServer", "ServerReady", "load_manifest", "parse_manifest"]
EDGE = [
    "ControlConfig",
    "ENGINES",
    "EdgeConfig",
    "EdgeRuntime",
    "EdgeStartError",
    "EngineBase",
    "FailSafeConfig",
    "LinkConfig",
    "LocalConfig",
    "PipelineConfig",
    "Produced",
    "RemoteEngine",
    "ReplayConfig",
    "ReplayEngine",
    "Request",
    "RtcEngine",
    "RunOptions",
    "RunSummary",
    "SecurityConfig",
    "ServerConfig",
    "SyncEngine",
    "load_edge_config",
    "make_engine",
]


@pytest.mark.parametrize(("package", "snapshot"), [("servo", SERVO), ("servo.server", SERVER), ("servo.edge", EDGE)])
def test_the_public_names_are_exactly_the_snapshot_and_each_resolves(package: str, snapshot: list[str]) -> None:
    module = importlib.import_module(package)
    assert sorted(module.__all__) == snapshot
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match=f"module {package!r} has no attribute 'Nope'"):
        _ = module.Nope


def test_a_servo_name_is_the_same_object_as_its_owners() -> None:
    from servo.client import PolicyClient
    from servo.edge.engine import EngineBase
    from servo.edge.failsafe import FailSafeConfig

    assert servo.PolicyClient is PolicyClient
    assert servo.EngineBase is servo.edge.EngineBase is EngineBase
    assert servo.FailSafeConfig is FailSafeConfig


@pytest.mark.parametrize("init", ["__init__.py", "server/__init__.py", "edge/__init__.py"])
def test_type_checkers_see_the_same_names(init: str) -> None:
    # The lazy table is what runs; the TYPE_CHECKING imports are what mypy and IDEs read.
    tree = ast.parse((PACKAGE / init).read_text())
    guarded = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    seen = [alias.asname for node in guarded.body if isinstance(node, ast.ImportFrom) for alias in node.names]
    package = importlib.import_module(f"servo{'.' + init.split('/')[0] if '/' in init else ''}")
    assert sorted(seen) == sorted(set(package.__all__) - {"__version__"})  # each listed once


def test_import_servo_loads_nothing_but_its_core() -> None:
    code = "import sys, servo; print(sorted(m for m in sys.modules if m.startswith(('servo', 'torch', 'zenoh'))))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    # servo.errors: the core raises servo's own error classes (a leaf module, nothing else of servo)
    assert json.loads(done.stdout.replace("'", '"')) == ["servo", "servo._core", "servo._exports", "servo.errors"]


def test_every_public_name_together_never_imports_torch() -> None:
    code = "import sys, servo; [getattr(servo, n) for n in servo.__all__]; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "False"


def test_the_control_process_imports_no_network_side() -> None:
    # It imports the servo package too: the public names must not drag the network side in.
    code = (
        "import sys, servo.edge.control_process; "
        "print(sorted(m for m in sys.modules if m.startswith(('zenoh', 'torch', 'servo.client', 'servo.server'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.py")), ids=lambda path: path.name)
def test_examples_import_only_the_public_api(example: Path) -> None:
    imported = set()
    for node in ast.walk(ast.parse(example.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert {name for name in imported if name.startswith("servo.")} == set()


def test_the_python_guide_example_runs(tmp_path: Path) -> None:
    guide = (ROOT / "docs" / "guides" / "python.md").read_text()
    code = re.search(r"```python\n(.*?)```", guide, re.S)
    assert code is not None
    port, health = free_port(), free_port()
    manifest = (ROOT / "examples" / "manifest.toml").read_text()
    manifest = manifest.replace("tcp/127.0.0.1:7447", f"tcp/127.0.0.1:{port}").replace("9100", str(health))
    (tmp_path / "manifest.toml").write_text(manifest)
    script = (
        code.group(1)
        .replace('"examples/manifest.toml"', repr(str(tmp_path / "manifest.toml")))
        .replace("tcp/127.0.0.1:7447", f"tcp/127.0.0.1:{port}")
        .replace("duration_s=5", "duration_s=2")
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["final_state"] == "streaming"
