"""The servo demo on one machine: a policy server and a simulated SO-100 arm.

Starts ``servo-serve examples/manifest.toml`` (reference policy, CPU), waits until it is healthy,
runs ``servo-edge --robot sim`` for a while, prints the run summary, then drains the server.
Refuses to start (exit 2) when either port is taken, so it never drives someone else's server.

    .venv/bin/python examples/demo.py --duration 15
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from servo.cli.ports import PortInUseError, refuse_busy

HERE = Path(__file__).resolve().parent


def wait_healthy(url: str, server: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Poll the server's /healthz until it answers 200 (loading torch and warming up takes a few s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"servo-serve exited with {server.returncode} before becoming healthy")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"servo-serve not healthy at {url} after {timeout_s:g} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds the arm runs")
    parser.add_argument("--port", type=int, default=7447, help="zenoh port of the server (loopback)")
    parser.add_argument("--health-port", type=int, default=9100, help="HTTP health/metrics port")
    parser.add_argument("--manifest", default=str(HERE / "manifest.toml"))
    args = parser.parse_args()

    endpoint = f"tcp/127.0.0.1:{args.port}"
    try:
        # Checked here, not only by servo-serve: another server's /healthz would answer first.
        refuse_busy([endpoint], "127.0.0.1", args.health_port)
    except PortInUseError as exc:
        print(
            f"demo: error: {exc} (another demo?); stop it or choose free ports with --port, --health-port",
            file=sys.stderr,
        )
        return 2
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "servo.cli.serve",
            args.manifest,
            "--listen",
            endpoint,
            "--health-port",
            str(args.health_port),
        ]
    )
    try:
        wait_healthy(f"http://127.0.0.1:{args.health_port}/healthz", server, timeout_s=120)
        with tempfile.TemporaryDirectory() as tmp:
            summary_path = Path(tmp) / "summary.json"
            edge = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "servo.cli.edge",
                    "--robot",
                    "sim",
                    "--connect",
                    endpoint,
                    "--duration",
                    str(args.duration),
                    "--summary",
                    str(summary_path),
                ],
                check=False,
            )
            if summary_path.exists():
                print(json.dumps(json.loads(summary_path.read_text()), indent=2))
            return edge.returncode
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    sys.exit(main())
