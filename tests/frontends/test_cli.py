"""``servo-serve`` with ``[frontends.openpi]``: ports refused in one line, websockets imported lazily."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from servo.cli.serve import classify
from tests.server.test_cli import REPO, reference_manifest, serve_command, serve_process
from tests.support import free_port


def test_a_busy_openpi_port_is_refused_in_one_line(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.toml"
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        held = other.getsockname()[1]
        manifest.write_text(
            reference_manifest(free_port(), compute_ms=0) + f'[frontends.openpi]\nlisten = "127.0.0.1:{held}"\n'
        )
        done = subprocess.run(serve_command(manifest), capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    head = f"servo-serve: error: port {held} (frontends.openpi.listen on 127.0.0.1) is already in use "
    assert line.startswith(head + "(another servo-serve?); stop it, or choose free ports: --openpi-listen 127.0.0.1:")
    assert int(line.rsplit(":", 1)[1]) > held


def test_a_missing_websockets_is_one_line_naming_the_extra() -> None:
    assert classify(ModuleNotFoundError("No module named 'websockets'", name="websockets")) == (
        2,
        "the openpi front door needs websockets, which is not installed: pip install 'servo-robotics[openpi]'",
    )


def test_websockets_is_imported_only_when_the_front_door_is_configured() -> None:
    code = (
        "import sys, servo.cli.serve, servo.server.service, servo.client, servo.frontends\n"
        "from servo.server.manifest import parse_manifest\n"
        "assert servo.frontends.frontends_of(parse_manifest('[model]\\nsource = \"reference\"')) == []\n"
        "print('websockets' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


@pytest.mark.anyio
@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")
async def test_servo_serve_answers_openpi_clients_and_drains(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(reference_manifest(free_port(), compute_ms=0))
    ws_port = free_port()
    async with serve_process(manifest, "--openpi-listen", f"127.0.0.1:{ws_port}") as (process, lines):
        line = await lines.until(lambda text: "openpi front door" in text, timeout=60)
        assert f"ws://127.0.0.1:{ws_port}" in line
        await lines.until(lambda text: "servo-serve: ready" in text, timeout=10)

        def run() -> np.ndarray:
            client = WebsocketClientPolicy("127.0.0.1", ws_port)
            try:
                obs = {"state": np.zeros(6), "images": {"front": np.zeros((24, 32, 3), np.uint8)}}
                return np.asarray(client.infer(obs)["actions"])
            finally:
                client._ws.close()

        with anyio.fail_after(20):
            actions = await anyio.to_thread.run_sync(run)
        assert actions.ndim == 2
        assert actions.shape[1] == 6
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(15):
            assert await process.wait() == 0
