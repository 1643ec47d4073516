"""The servo demo on one machine: a policy server and a simulated SO-100 arm.

Starts ``servo-serve examples/manifest.toml`` (reference policy, CPU) and waits for it to say it
is ready, runs ``servo-edge --robot sim`` for a while, prints the run summary, then drains the
server. A port already taken is refused before anything starts (exit 2, one line naming it and
the flags that choose free ones: ``make demo DEMO_ARGS='--port 7448'``), so the demo never
drives someone else's server.

    .venv/bin/python examples/demo.py --duration 15
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from servo.cli.ports import PortInUseError, free_ports_advice, refuse_busy

HERE = Path(__file__).resolve().parent
#: What servo-serve says once it serves (after loading and warming the policy).
READY = "servo-serve: ready"


def relay(server: subprocess.Popen[str], ready: threading.Event) -> None:
    """servo-serve's lines go on to our stderr; its ready line (its own: not another server's) sets ``ready``."""
    assert server.stderr is not None
    for line in server.stderr:
        sys.stderr.write(line)
        if line.startswith(READY):
            ready.set()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds the arm runs")
    parser.add_argument("--port", type=int, default=7447, help="zenoh port of the server (loopback)")
    parser.add_argument("--health-port", type=int, default=9100, help="HTTP health/metrics port")
    parser.add_argument("--manifest", default=str(HERE / "manifest.toml"))
    args = parser.parse_args()

    endpoint = f"tcp/127.0.0.1:{args.port}"
    try:
        refuse_busy([endpoint], "127.0.0.1", args.health_port)
    except PortInUseError as busy:
        flags = free_ports_advice(busy, {"zenoh.listen": "--port", "ops.health_port": "--health-port"}, port_only=True)
        print(
            f"demo: error: {busy} (another servo-serve?); stop it, or choose free ports: make demo "
            f"DEMO_ARGS='{flags}' (examples/demo.py {flags})",
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
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    ready = threading.Event()
    relaying = threading.Thread(target=relay, args=(server, ready), name="demo-relay", daemon=True)
    relaying.start()
    try:
        # Loading torch and warming up takes a few seconds.
        while not ready.wait(0.2):
            if server.poll() is not None:
                relaying.join()
                print(f"demo: error: servo-serve exited with {server.returncode} before it was ready", file=sys.stderr)
                return 2 if server.returncode == 2 else 1
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
        relaying.join(timeout=5)


if __name__ == "__main__":
    sys.exit(main())
