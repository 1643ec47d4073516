"""As a library servo prints nothing; stdlib logging decides; the CLIs render with context."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.support import free_port

SCRIPT = """
import anyio, numpy as np
from servo.client import PolicyClient
from servo.transport import ZenohSettings
from tests.support import make_manifest, running_server
{setup}

async def main():
    async with running_server(make_manifest({port})):
        settings = ZenohSettings(mode="client", connect=["tcp/127.0.0.1:{port}"])
        async with PolicyClient.connect(settings, "quiet") as client:
            (server,) = await client.discover()
            session = await client.open_session(server, features=server.status.policy.features, fps=30)
            state = np.zeros(6, np.float32)
            frame = np.zeros((48, 64, 3), np.uint8)
            await session.infer(state, {{"front": frame}}, timeout=10)
            await session.close()
    print("RESULT ok")

anyio.run(main)
"""


def run(setup: str) -> subprocess.CompletedProcess[str]:
    code = SCRIPT.format(setup=textwrap.dedent(setup), port=free_port())
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.slow
def test_library_use_prints_nothing_until_the_application_configures_logging() -> None:
    quiet = run("")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == "RESULT ok\n"
    assert quiet.stderr == ""
    shown = run("import logging; logging.basicConfig(level=logging.DEBUG)")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == "RESULT ok\n"
    assert "'event': 'session opened'" in shown.stderr  # context travels with the record
    assert "'client_id': 'quiet'" in shown.stderr
    silenced = run(
        'import logging; logging.basicConfig(level=logging.DEBUG); logging.getLogger("servo").setLevel(logging.ERROR)'
    )
    assert "session opened" not in silenced.stderr


def test_every_module_logs_through_servo_logs() -> None:
    """structlog's own loggers print to stdout unless configured: modules must use servo.logs."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "python" / "servo"
    offenders = []
    for path in package.rglob("*.py"):
        if path.name == "logs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("get_logger", "getLogger")
                and isinstance(node.value, ast.Name)
                and node.value.id == "structlog"
            ):
                offenders.append(f"{path.relative_to(package)}:{node.lineno}")
    assert offenders == []
