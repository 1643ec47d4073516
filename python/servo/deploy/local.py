"""A whole fleet on this machine: ``servo-router``, replicas, simulated robots and ``servo-monitor``.

What ``servo-fleet up`` runs, and what the observability tests run: every member is the real
command (``python -m servo.cli.…``) in a process of its own, on 127.0.0.1, with credentials
generated into the fleet's directory (`servo.deploy.local_files`). Started in dependency order,
each one ready before the next begins (the router says it is, a replica's ``/healthz``
says serving, the monitor's page answers); stopped in reverse (robots park, the monitor closes,
replicas drain, the router goes last), each group given a bounded time before it is killed.

::

    router ◄── replicas (servo-serve manifest.toml --connect … --replica replica-N --health-port …)
       ▲  ◄── robots (servo-edge --robot sim --connect … --client-id robot-N, own servo directory)
       └───── monitor (servo-monitor --connect … --http-port 9200 --fleet fleet.toml --identity-key …)

Each member runs in a process group of its own (a Ctrl-C at the terminal reaches only the fleet,
which then stops its members once, in order) and is ended by the kernel if the process that
started it dies first (``PR_SET_PDEATHSIG``): a killed fleet leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servo.deploy.local_files import MONITOR_USER, FleetFiles, write_fleet_files
from servo.errors import StartError
from servo.logs import get_logger

log = get_logger(__name__)

#: How long the members of one stage (robots, then monitor and replicas, then the router) have
#: to stop after SIGTERM before they are killed: a robot parks, a replica drains.
STOP_GRACE_S = 15.0
_PR_SET_PDEATHSIG = 1


class FleetError(StartError, RuntimeError):
    """A member could not start; the message names it and ends with its last log lines."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (chosen by the kernel)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Member:
    """One process of the fleet, its output in its log file. Owned by the fleet's thread.

    Args:
        name: Its name in the fleet (``replica-0``, ``robot-2``, ``router``, ``monitor``).
        argv: The command (``python -m servo.cli.…``).
        log_path: Where its stdout and stderr go.
        env: Variables added to this process's environment.
    """

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_path
        libc = ctypes.CDLL(None, use_errno=True)
        parent = os.getpid()

        def end_with_parent() -> None:  # runs in the child between fork and exec: no locks, no allocations
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # the parent died before the line above
                os._exit(1)

        with log_path.open("ab") as out:
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                process_group=0,
                preexec_fn=end_with_parent,  # safe here: the fleet starts its members from one thread
            )

    @property
    def pid(self) -> int:
        """Its process id (its process group's too)."""
        return self.popen.pid

    def running(self) -> bool:
        """Whether the process has not exited."""
        return self.popen.poll() is None

    def tail(self, lines: int = 15) -> str:
        """The last lines of its log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def terminate(self) -> None:
        """SIGTERM to the process alone, not its group.

        A robot parks its arm through its control process, which must keep ticking meanwhile (a
        SIGTERM of its own would stop it at once).
        """
        if self.running():
            self.popen.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to its whole process group (its control process too: a crash, no goodbye) and reap."""
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()


@dataclass
class FleetPlan:
    """What to start: how many replicas and robots, whether a monitor, which ports (0: a free one)."""

    replicas: int = 2
    robots: int = 3
    monitor: bool = True
    http_port: int = 9200
    router_port: int = 0
    log_level: str = "warning"


class LocalFleet:
    """The fleet's processes, started by `start` and ended by `stop`. Owned by the thread that starts it.

    Args:
        directory: Where its files go (created; existing files there are refused, not replaced).
        plan: What to start.
        say: Told one line per stage as it becomes ready.
    """

    def __init__(self, directory: Path, plan: FleetPlan, say: Callable[[str], None] = lambda _: None) -> None:
        self.plan = plan
        self.say = say
        self.router_port = plan.router_port or free_port()
        self.monitor_port = plan.http_port or free_port()
        self.robot_names = [f"robot-{i}" for i in range(plan.robots)]
        directory.mkdir(parents=True, exist_ok=True)
        self.files: FleetFiles = write_fleet_files(directory, router_port=self.router_port, robots=self.robot_names)
        self.router: Member | None = None
        self.replicas: dict[str, Member] = {}
        self.health_ports: dict[str, int] = {}
        self.robots: dict[str, Member] = {}
        self.monitor: Member | None = None
        self._cancel = threading.Event()

    @property
    def endpoint(self) -> str:
        """The router's endpoint, which every member connects to."""
        return f"tcp/127.0.0.1:{self.router_port}"

    @property
    def url(self) -> str:
        """The monitor's page."""
        return f"http://127.0.0.1:{self.monitor_port}/"

    @property
    def members(self) -> list[Member]:
        """Every process, in the order they start."""
        first = [] if self.router is None else [self.router]
        last = [] if self.monitor is None else [self.monitor]
        return first + list(self.replicas.values()) + list(self.robots.values()) + last

    # ------------------------------------------------------------------ start
    def start(self, timeout_s: float = 120.0, *, cancel: threading.Event | None = None) -> None:
        """Start every member, each stage ready before the next; `stop` what started if one fails.

        Raises:
            FleetError: a member exited or was not ready within ``timeout_s`` (its log tail said),
                or ``cancel`` was set meanwhile.
        """
        self._cancel = cancel or threading.Event()
        deadline = time.monotonic() + timeout_s
        try:
            self._start(deadline)
        except FleetError:
            self.stop()
            raise
        except BaseException:  # a second interrupt, a bug: nothing is waited for
            self.kill()
            raise

    def _start(self, deadline: float) -> None:
        plan, files = self.plan, self.files
        self.router = self._spawn("router", "servo.cli.router", str(files.fleet))
        router = self.router
        self._wait(router, deadline, "ready", lambda: "servo-router: ready" in router.tail())
        self.say(f"router on {self.endpoint} (fleet file {files.fleet}; a generated password per member)")
        for i in range(plan.replicas):
            name = f"replica-{i}"
            self.health_ports[name] = port = free_port()
            self.replicas[name] = self._spawn(
                name,
                "servo.cli.serve",
                str(files.manifest),
                *("--connect", self.endpoint, "--replica", name, "--health-port", str(port)),
                env={"SERVO_CONFIG_DIR": str(files.servers_home)},
            )
        for name, replica in self.replicas.items():
            health = f"http://127.0.0.1:{self.health_ports[name]}/healthz"
            self._wait(replica, deadline, "serving", functools.partial(_http_ok, health))
            self.say(f"{name} serving (health {health})")
        for name in self.robot_names:
            self.robots[name] = self._spawn(
                name,
                "servo.cli.edge",
                *("--robot", "sim", "--robot-opt", "cameras=front:64x48", "--no-status"),
                *("--connect", self.endpoint, "--client-id", name, "--telemetry-period-s", "0.5"),
                *("--auth-user", name, "--auth-password-file", str(files.secret(name))),
                *("--summary", str(files.summary(name))),
                env={"SERVO_CONFIG_DIR": str(files.robot_home(name))},
            )
        if plan.robots:
            self.say(f"{plan.robots} simulated robot(s) started: {', '.join(self.robot_names)}")
        if plan.monitor:
            self.monitor = self._spawn(
                "monitor",
                "servo.cli.monitor",
                *("--connect", self.endpoint, "--http-port", str(self.monitor_port)),
                *("--auth-user", MONITOR_USER, "--auth-password-file", str(files.secret(MONITOR_USER))),
                *("--robot-keys", str(files.robot_keys), "--fleet", str(files.fleet)),
                *("--identity-key", str(files.monitor_key)),
            )
            self._wait(self.monitor, deadline, "serving its page", lambda: _http_ok(f"{self.url}api/fleet"))

    def _spawn(self, name: str, module: str, *args: str, env: dict[str, str] | None = None) -> Member:
        """Start a member; its servo directory is in the fleet's (the user's is never read or written)."""
        argv = [sys.executable, "-m", module, *args, "--log-level", self.plan.log_level]
        member = Member(
            name, argv, self.files.log(name), {"SERVO_CONFIG_DIR": str(self.files.directory), **(env or {})}
        )
        log.debug("member started", member=name, pid=member.pid)
        return member

    def _wait(self, member: Member, deadline: float, what: str, ready: Callable[[], bool]) -> None:
        """Poll ``ready`` until it holds; FleetError if ``member`` exits first or time runs out."""
        while not ready():
            if not member.running():
                raise FleetError(
                    f"{member.name} exited with status {member.popen.returncode} before {what}; "
                    f"{member.log_path} ends with:\n{member.tail()}"
                )
            if self._cancel.is_set():
                raise FleetError(f"interrupted while {member.name} was not {what} yet")
            if time.monotonic() > deadline:
                raise FleetError(f"{member.name} not {what} in time; {member.log_path} ends with:\n{member.tail()}")
            time.sleep(0.1)

    # ------------------------------------------------------------------ what the monitor sees
    def fleet_view(self) -> dict[str, Any] | None:
        """The monitor's ``/api/fleet`` (None without a monitor, or when it does not answer)."""
        if self.monitor is None:
            return None
        try:
            with urllib.request.urlopen(f"{self.url}api/fleet", timeout=2) as reply:
                view: dict[str, Any] = json.load(reply)
                return view
        except (OSError, ValueError):
            return None

    def streaming(self) -> set[str]:
        """The robots the monitor shows streaming."""
        view = self.fleet_view() or {}
        return {robot["id"] for robot in view.get("robots", []) if robot.get("state") == "streaming"}

    # ------------------------------------------------------------------ stop
    def stop(self, grace_s: float = STOP_GRACE_S) -> dict[str, int]:
        """SIGTERM by stage (robots; monitor and replicas; router), SIGKILL after ``grace_s`` each.

        Returns each member's exit status (negative: ended by that signal).
        """
        monitor = [] if self.monitor is None else [self.monitor]
        router = [] if self.router is None else [self.router]
        for stage in (list(self.robots.values()), monitor + list(self.replicas.values()), router):
            for member in stage:
                member.terminate()
            deadline = time.monotonic() + grace_s
            for member in stage:
                try:
                    member.popen.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning("member did not stop in time: killed", member=member.name, grace_s=grace_s)
                    member.kill()
        return {member.name: member.popen.returncode for member in self.members}

    def kill(self) -> None:
        """SIGKILL every member at once (a second interrupt)."""
        for member in self.members:
            member.kill()


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return bool(reply.status == 200)
    except (OSError, urllib.error.HTTPError):
        return False
