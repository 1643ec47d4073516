"""A small real fleet on loopback for the observability tests: a Zenoh router, replicas of the
reference policy (``servo-serve``), simulated robots (``servo-edge --robot sim``) and
``servo-monitor``, each in its own process except the router, every one stopped at the end.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import zenoh

from servo.identity import load_identity
from servo.transport import ZenohSettings
from servo.wire import fingerprint
from tests.edge.harness import Proc, edge_argv
from tests.support import free_port


@dataclass
class Fleet:
    """What `running_fleet` started; ``replicas`` and ``robots`` by name."""

    router_port: int
    monitor_port: int
    workdir: Path
    replicas: dict[str, Proc] = field(default_factory=dict)
    health_ports: dict[str, int] = field(default_factory=dict)
    robots: dict[str, Proc] = field(default_factory=dict)
    monitor: Proc | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.monitor_port}"

    def audit_log(self, replica: str) -> Path:
        return self.workdir / f"{replica}.audit.jsonl"


def manifest(fleet: Fleet, replica: str, health_port: int) -> Path:
    path = fleet.workdir / f"{replica}.toml"
    path.write_text(
        f"""
[model]
source = "reference"
warmup = 1
[model.options]
cameras = {{front = [48, 64]}}
chunk_size = 20
[serving]
app = "obs"
replica = "{replica}"
[zenoh]
mode = "client"
connect = ["tcp/127.0.0.1:{fleet.router_port}"]
[ops]
health_port = {health_port}
audit_log = "{fleet.audit_log(replica)}"
[security]
identity_key = "{fleet.workdir / "server.key"}"
operators = [{{name = "monitor", identity = "{fingerprint(load_identity(fleet.workdir / "monitor.key").public_key)}"}}]
"""
    )
    return path


@contextmanager
def running_fleet(workdir: Path, *, replicas: int = 2, robots: int = 3, monitor: bool = True) -> Iterator[Fleet]:
    """Start the fleet; each robot has its own servo directory (its own identity)."""
    fleet = Fleet(free_port(), free_port(), workdir)
    with ExitStack() as stack:
        settings = ZenohSettings(mode="router", listen=[f"tcp/127.0.0.1:{fleet.router_port}"])
        stack.enter_context(zenoh.open(settings.to_config()))
        procs: list[Proc] = []
        stack.callback(lambda: [proc.stop() for proc in reversed(procs)])
        for i in range(replicas):
            name = f"replica-{i}"
            fleet.health_ports[name] = port = free_port()
            argv = [sys.executable, "-m", "servo.cli.serve", str(manifest(fleet, name, port)), "--log-level", "warning"]
            procs.append(proc := Proc(argv))
            fleet.replicas[name] = proc
        for proc in fleet.replicas.values():
            proc.wait_line("ready", 90)
        pins = []
        for i in range(robots):
            name = f"robot-{i}"
            home = workdir / name
            home.mkdir()
            pins.append(f"{name} {fingerprint(load_identity(home / 'robot.key', role='robot').public_key)}\n")
            command = (
                f"--robot sim --robot-opt cameras=front:64x48 --connect tcp/127.0.0.1:{fleet.router_port} "
                f"--client-id {name} --telemetry-period-s 0.5 --log-level warning --record {workdir / name}.servo"
            )
            procs.append(proc := Proc(edge_argv(command), env={"SERVO_CONFIG_DIR": str(home)}))
            fleet.robots[name] = proc
        if monitor:
            argv = [
                sys.executable,
                "-m",
                "servo.cli.monitor",
                "--connect",
                f"tcp/127.0.0.1:{fleet.router_port}",
                "--http-port",
                str(fleet.monitor_port),
                # The fleet as its operator enrolled it: the replicas' identity, the robots' keys.
                "--trusted-servers",
                fingerprint(load_identity(workdir / "server.key").public_key),
                "--robot-keys",
                str(workdir / "robot-keys"),
                "--identity-key",
                str(workdir / "monitor.key"),
                "--state-file",
                str(workdir / "monitor.state"),
            ]
            (workdir / "robot-keys").write_text("".join(pins))
            procs.append(proc := Proc(argv))
            fleet.monitor = proc
            proc.wait_line("serving the fleet page", 60)
        yield fleet
