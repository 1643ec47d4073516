"""The servo demo on one machine: a policy server and a simulated SO-100 arm.

Starts ``servo-serve examples/manifest.toml`` (reference policy, CPU) and waits for it to say it
is ready, runs ``servo-edge --robot sim`` for a while, prints the run summary, then drains the
server. servo-serve refuses a port already taken before it loads anything (one line naming it and
free ports near it), so the demo never drives someone else's server; the demo then says the same
free ports as its own flags (``make demo DEMO_ARGS='--port 7448'``).

    .venv/bin/python examples/demo.py --duration 15
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: What servo-serve says once it serves (after loading and warming the policy).
READY = "servo-serve: ready"
#: How servo-serve names free ports when one it was given is taken.
FREE_PORTS = re.compile(r"^servo-serve: error: .* already in use .*choose free ports: (.+)$")
#: servo-serve's flags that move a port -> the demo's.
DEMO_FLAGS = {"--listen": "--port", "--health-port": "--health-port"}


def relay(server: subprocess.Popen[str], ready: threading.Event, said: list[str]) -> None:
    """servo-serve's lines go on to our stderr (and into ``said``); its ready line (its own: not
    another server's) sets ``ready``."""
    assert server.stderr is not None
    for line in server.stderr:
        sys.stderr.write(line)
        said.append(line.rstrip("\n"))
        if line.startswith(READY):
            ready.set()


def free_ports(said: list[str]) -> str | None:
    """The free ports servo-serve named, as the demo's flags (``--port 7448 --health-port 9101``)."""
    for line in said:
        found = FREE_PORTS.match(line)
        if found:
            flags = shlex.split(found.group(1))
            pairs = zip(flags[::2], flags[1::2], strict=False)
            return " ".join(
                f"{DEMO_FLAGS[flag]} {value.rsplit(':', 1)[-1]}" for flag, value in pairs if flag in DEMO_FLAGS
            )
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds the arm runs")
    parser.add_argument("--port", type=int, default=7447, help="zenoh port of the server (loopback)")
    parser.add_argument("--health-port", type=int, default=9100, help="HTTP health/metrics port")
    parser.add_argument("--manifest", default=str(HERE / "manifest.toml"))
    args = parser.parse_args()

    endpoint = f"tcp/127.0.0.1:{args.port}"
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
    ready, said = threading.Event(), []
    relaying = threading.Thread(target=relay, args=(server, ready, said), name="demo-relay", daemon=True)
    relaying.start()
    try:
        # Loading torch and warming up takes a few seconds.
        while not ready.wait(0.2):
            if server.poll() is not None:
                relaying.join()
                flags = free_ports(said)
                advice = (
                    f"; stop the other server, or choose free ports: make demo DEMO_ARGS='{flags}' "
                    f"(examples/demo.py {flags})"
                    if flags
                    else ""
                )
                print(
                    f"demo: error: servo-serve exited with {server.returncode} before it was ready{advice}",
                    file=sys.stderr,
                )
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
