"""``servo-serve`` on the network: a TLS or QUIC listen without a certificate, the edge command it
prints (run as printed, on 127.0.0.1), the capacity plan and its warning, and the flags' errors."""

from __future__ import annotations

import json
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.edge.harness import Proc
from tests.support import free_port

REFERENCE = """
[model]
source = "reference"
warmup = 2
[model.options]
cameras = {{front = [48, 64]}}
chunk_size = {chunk}
compute_ms = {compute_ms}
[ops]
health_port = 0
"""


def serve(tmp_path: Path, *args: str, chunk: int = 20, compute_ms: float = 0.0) -> Proc:
    """``servo-serve manifest.toml ARGS`` once it says it is ready (the test's servo directory: conftest)."""
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(REFERENCE.format(chunk=chunk, compute_ms=compute_ms))
    proc = Proc([sys.executable, "-m", "servo.cli.serve", str(manifest), "--log-level", "warning", *args])
    try:
        proc.wait_line("ready", 90)
    except BaseException:
        proc.kill()
        raise
    return proc


def printed_command(proc: Proc, label: str) -> list[str]:
    """The ``servo-edge`` command after ``label`` in the server's output, as argv."""
    line = proc.wait_line(f"servo-serve: {label}: servo-edge ", 5)
    return shlex.split(line.split(f"{label}: ", 1)[1])


@pytest.mark.parametrize("protocol", ["tls", "quic"])
def test_a_tls_or_quic_listen_gets_a_certificate_and_the_printed_edge_command_works(
    tmp_path: Path, servo_config_dir: Path, protocol: str
) -> None:
    port = free_port()
    server = serve(tmp_path, "--listen", f"{protocol}/127.0.0.1:{port}")
    try:
        certificate = servo_config_dir / "tls" / "server.pem"
        assert f"TLS with the self-signed certificate {certificate} (created;" in server.output
        assert stat.S_IMODE(certificate.with_name("server.key").stat().st_mode) == 0o600
        command = printed_command(server, "without hardware")
        # (--buffer-time-s in between when the capacity plan, timed at this machine's load, asks for it)
        assert command[:3] == ["servo-edge", "--robot", "sim"]
        assert command[-4:] == ["--connect", f"{protocol}/127.0.0.1:{port}", "--tls-root-ca", "server.pem"]
        robot = tmp_path / "robot"  # the robot's side: its copy of the certificate, as the line says
        robot.mkdir()
        shutil.copy(certificate, robot / "server.pem")
        summary = robot / "run.json"
        run_flags = ["--no-status", "--duration", "3", "--summary", str(summary)]
        edge = subprocess.run(
            [sys.executable, "-m", "servo.cli.edge", *command[1:], *run_flags],
            cwd=robot,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
    finally:
        server.stop()
    assert edge.returncode == 0, edge.stderr
    run = json.loads(summary.read_text())
    assert run["final_state"] == "streaming"
    assert run["chunks_received"] >= 2
    assert run["actions_executed"] > 0


def test_a_tcp_listen_stays_without_certificate(tmp_path: Path, servo_config_dir: Path) -> None:
    port = free_port()
    server = serve(tmp_path, "--listen", f"tcp/127.0.0.1:{port}")
    server.stop()
    assert "self-signed" not in server.output
    assert not (servo_config_dir / "tls").exists()
    (sim,) = [
        line for line in server.lines if line.startswith("servo-serve: without hardware: servo-edge --robot sim ")
    ]
    assert sim.endswith(f" --connect tcp/127.0.0.1:{port}")


def test_the_capacity_plan_warns_when_a_forward_outlasts_a_chunk(tmp_path: Path) -> None:
    # 10 steps at 30 fps = 333 ms; each forward is padded to 400 ms.
    server = serve(tmp_path, "--listen", f"tcp/127.0.0.1:{free_port()}", chunk=10, compute_ms=400)
    server.stop()
    plan = server.wait_line("servo-serve: forward ", 1)
    assert "chunk 10 steps = 333 ms at 30 fps" in plan
    assert "capacity: one replica carries 0 robot(s)" in server.output
    warning = server.wait_line("servo-serve: warning: a forward (", 1)
    assert "takes longer than a chunk lasts (333 ms at 30 fps)" in warning
    assert "a GPU: servo-serve --device cuda" in warning


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give a manifest file or --lerobot PATH (one of them)"),
        (["{manifest}", "--lerobot", "ckpt"], "give a manifest file or --lerobot PATH (one of them)"),
        (["{manifest}", "--fps", "10"], "--fps need --lerobot"),
        (["{manifest}", "--max-sessions", "0"], "serving.max_sessions = 0: expected int >= 1"),
        (["--lerobot", "{tmp}", "--device", "gpu"], "model.device = 'gpu': must be cpu, cuda, cuda:N or mps"),
    ],
)
def test_flag_mistakes_are_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(REFERENCE.format(chunk=20, compute_ms=0))
    argv = [a.replace("{manifest}", str(manifest)).replace("{tmp}", str(tmp_path)) for a in args]
    done = subprocess.run([sys.executable, "-m", "servo.cli.serve", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("servo-serve: error:")]
    assert len(lines) == 1, done.stderr
    assert message in lines[0]
