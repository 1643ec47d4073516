"""The simulated ROS 2 arm (`servo.robots.ros2.sim_node`) as a child process of a test, and the
robot options that drive it."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servo.robots import Robot, RobotFault
from tests.edge.harness import Proc

#: The arm's own joint names and order: not the policy's order, and one joint the policy does not drive.
NODE_JOINTS = ("wrist_joint", "elbow_joint", "head_pan", "shoulder_lift_joint", "shoulder_pan_joint", "gripper_joint")
#: Its start pose (rad), distinct per joint so a wrong mapping shows.
NODE_POSE = (0.5, -0.4, 0.9, 0.3, 0.1, 0.2)
#: The policy's joints in its order, each mapped to one of the arm's.
POLICY_JOINTS = {
    "pan": "shoulder_pan_joint",
    "lift": "shoulder_lift_joint",
    "elbow": "elbow_joint",
    "wrist": "wrist_joint",
    "grip": "gripper_joint",
}
LOWER = (-1.5, -1.5, -1.5, -1.5, 0.0)
UPPER = (1.5, 1.5, 1.5, 1.5, 1.4)
MAX_VELOCITY = (1.0, 1.0, 1.0, 1.0, 1.0)
REST = (0.0, 0.0, 0.0, 0.0, 0.5)


@dataclass(frozen=True)
class RosEnv:
    """One test's ROS world: a domain, a namespace, Cyclone's configuration (in the environment)
    and, for rmw_zenoh's transport, the Zenoh router's endpoint."""

    domain_id: int
    namespace: str
    uri: str
    zenoh_router: str = ""

    def over_zenoh(self, router: str) -> RosEnv:
        """The same world with the robot and the arm on rmw_zenoh's transport through ``router``."""
        return dataclasses.replace(self, zenoh_router=router)

    def robot_options(self, **extra: Any) -> dict[str, Any]:
        """``--robot ros2`` options for the simulated arm, as the command line gives them (text)."""
        options = {
            "joints": ",".join(f"{mine}={theirs}" for mine, theirs in POLICY_JOINTS.items()),
            "rest_pose": ",".join(map(str, REST)),
            "lower": ",".join(map(str, LOWER)),
            "upper": ",".join(map(str, UPPER)),
            "max_velocity": ",".join(map(str, MAX_VELOCITY)),
            "namespace": self.namespace,
            "domain_id": str(self.domain_id),
            "connect_timeout_s": "20",
            "state_timeout_s": "0.5",
        }
        if self.zenoh_router:
            options.update(transport="zenoh", zenoh_connect=self.zenoh_router)
        options.update({key: str(value) for key, value in extra.items()})
        return options

    def robot_flags(self, **extra: Any) -> str:
        """The same options as ``--robot ros2 --robot-opt KEY=VALUE …``."""
        return "--robot ros2 " + " ".join(
            f"--robot-opt {key}={value}" for key, value in self.robot_options(**extra).items()
        )

    def start_node(self, *args: str, record: Path | None = None, timeout: float = 30.0) -> Proc:
        """The simulated arm in this DDS world, once it says it is ready."""
        argv = [
            sys.executable,
            "-m",
            "servo.robots.ros2.sim_node",
            "--joints",
            ",".join(NODE_JOINTS),
            "--initial-pose",
            ",".join(map(str, NODE_POSE)),
            "--namespace",
            self.namespace,
            "--domain-id",
            str(self.domain_id),
            "--sim-time",
            "--duration",
            "120",
            *(["--record", str(record)] if record else []),
            *(["--transport", "zenoh", "--zenoh-connect", self.zenoh_router] if self.zenoh_router else []),
            *args,
        ]
        proc = Proc(argv)
        try:
            proc.wait_line("READY", timeout)
        except BaseException:
            proc.kill()
            raise
        return proc


def received(record: Path) -> list[dict[str, Any]]:
    """The targets the arm recorded, oldest first."""
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


class NoPoses:
    """ROS 2 cameras show what the robot's cameras see: they ask for no pose."""

    def latest_pose(self) -> None:
        return None


def first_fault(robot: Robot, timeout: float = 10.0) -> tuple[float, str]:
    """Read the robot's state until it raises RobotFault: (seconds it took, the message)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            robot.read_state()
        except RobotFault as exc:
            return time.monotonic() - started, str(exc)
        time.sleep(0.01)
    raise AssertionError(f"no RobotFault within {timeout} s")
