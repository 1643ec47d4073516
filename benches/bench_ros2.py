"""``--robot ros2`` at 100 Hz (issue 20): tick lateness with the joints on DDS, against the simulated arm.

The setup of ``bench_edge.py``: ``servo-serve`` in another process (reference policy padded to
20 ms, two 480x640 cameras), the remote engine streaming JPEG q90, the control loop in its own
process under SCHED_FIFO at 100 Hz, a busy-loop process per core (normal priority). Robots, same
run:

* ``ros2`` — servo's: the simulated ROS 2 arm (``python -m servo.robots.ros2.sim_node``) in its own
  process publishes JointState at 200 Hz and two 640x480 CompressedImage (JPEG) topics at 30 fps
  over Cyclone DDS on loopback; the control process takes the newest states and writes JointState
  targets (the edge's main process reads and decodes the images). Raw 640x480 frames (900 KB, some
  60 UDP fragments each, best-effort) are lost whole whenever the receiving process is starved
  long enough for the socket to overflow, which the hogs make routine here. Joint names, order and
  units differ from the policy's. The arm runs under SCHED_FIFO at priority 5 (drivers run
  real-time; below servo's loop at 10), so the hogs starve neither of them.
* ``sim`` — the baseline: the simulated arm inside the control process (``bench_edge``'s ``process``).

Lateness = how late a tick started after its absolute deadline (the control loop's histogram, 10 µs
bins below 10 ms: p50/p99 are upper bounds, max exact), every tick of a round, the park included.

Smoke (CI): ``pytest benches/bench_ros2.py --benchmark-disable`` (one 1.5 s round per robot, no hogs).
Measure (as root, so SCHED_FIFO is permitted)::

    pytest benches/bench_ros2.py --benchmark-enable --benchmark-only -s

3 rounds of 10 s per robot (``EDGE_BENCH_ROUNDS`` / ``EDGE_BENCH_S``, hogs off with ``EDGE_BENCH_HOGS=0``).
Target (``extra_info["target_met"]``): the control-loop figures of docs/guides/performance.md at 100 Hz, p99 <= 1 ms and
max <= 5 ms.
"""

from __future__ import annotations

import math
import os
import secrets
import sys
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from benches._edge_rig import LoopResult, ServerProcess, pooled_rounds, run_servo, table
from benches._support import ready_process
from servo.logs import configure_logging
from servo.robots import RobotDescription
from servo.robots import so100_joints as so100
from servo.robots.ros2.dds import loopback_config
from servo.robots.ros2.options import MAX_DOMAIN_ID
from testbed.processes import free_port

FPS = 100.0
P99_TARGET_MS = 1.0
MAX_TARGET_MS = 5.0
#: The arm's own joint names, in its own order (the policy's names are LeRobot's).
NODE_JOINTS = ("gripper", "wrist_roll", "wrist_flex", "elbow_flex", "shoulder_lift", "shoulder_pan")
#: Policy joint -> the arm's joint.
MAPPING = dict(zip(so100.JOINT_NAMES, reversed(NODE_JOINTS), strict=True))
CAMERAS = ("front:cam/front/compressed:640x480@30", "wrist:cam/wrist/compressed:640x480@30")
ROWS: list[dict[str, Any]] = []


def ros_units(values: tuple[float, ...]) -> list[float]:
    """SO-100 values (degrees, the gripper 0..100) on the ROS side: radians, the gripper raw."""
    return [math.radians(v) for v in values[:-1]] + [values[-1]]


def ros2_robot(namespace: str, domain_id: int) -> RobotDescription:
    def text(values: list[float]) -> str:
        return ",".join(f"{v:.6f}" for v in values)

    return RobotDescription(
        "ros2",
        {
            "joints": ",".join(f"{mine}={theirs}" for mine, theirs in MAPPING.items()),
            "units": "degrees,degrees,degrees,degrees,degrees,raw",
            "lower": text(ros_units(so100.LOWER)),
            "upper": text(ros_units(so100.UPPER)),
            "max_velocity": text(ros_units(so100.MAX_VELOCITY)),
            "rest_pose": text(ros_units(so100.REST_POSE)),
            "cameras": ",".join(CAMERAS),
            "namespace": namespace,
            "domain_id": domain_id,
            "fps": FPS,
            "state_timeout_s": 0.5,
            "connect_timeout_s": 30,
        },
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, RobotDescription]]:
    """The policy server, and the simulated ROS 2 arm on a DDS domain of its own (loopback only)."""
    configure_logging("warning")
    namespace, domain_id = f"/servo_bench_{secrets.token_hex(4)}", 1 + secrets.randbelow(MAX_DOMAIN_ID)
    rest = dict(zip(MAPPING.values(), ros_units(so100.REST_POSE), strict=True))
    node = [sys.executable, "-m", "servo.robots.ros2.sim_node", "--joints", ",".join(NODE_JOINTS)]
    node += ["--initial-pose", ",".join(str(rest[name]) for name in NODE_JOINTS), "--rate", "200"]
    node += ["--max-velocity", "20", "--namespace", namespace, "--domain-id", str(domain_id), "--realtime", "5"]
    for camera in CAMERAS:
        node += ["--camera", camera]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CYCLONEDDS_URI", loopback_config())
        server = ServerProcess(Path(tmp_path_factory.mktemp("ros2-bench")), free_port())
        try:
            server.wait_ready()
            with ready_process(node, "the simulated ROS 2 arm", check=False):
                yield server, ros2_robot(namespace, domain_id)
        finally:
            server.stop()
            if ROWS:
                print("\n" + table(ROWS))


@pytest.mark.parametrize("robot", ["ros2", "sim"])
def test_ros2_loop(benchmark: BenchmarkFixture, world: tuple[ServerProcess, RobotDescription], robot: str) -> None:
    server, ros2 = world
    benchmark.group = f"robot loop {FPS:g} Hz"
    duration = 1.5 if benchmark.disabled else float(os.environ.get("EDGE_BENCH_S", "10"))
    rounds = 1 if benchmark.disabled else int(os.environ.get("EDGE_BENCH_ROUNDS", "3"))
    hogs = not benchmark.disabled and os.environ.get("EDGE_BENCH_HOGS", "1") == "1"

    def one_round() -> Awaitable[LoopResult]:
        return run_servo(
            server,
            FPS,
            duration,
            control_loop="auto",
            realtime=True,
            switch_interval_s=0.001,
            design=robot,
            robot=ros2 if robot == "ros2" else None,
        )

    def run() -> LoopResult:
        return pooled_rounds(server, rounds, hogs, one_round)

    result: LoopResult = benchmark.pedantic(run, rounds=1, iterations=1)
    summary = result.summary()
    ROWS.append(summary)
    benchmark.extra_info.update(summary)
    ran = result.ticks + result.missed_deadlines >= 0.9 * rounds * duration * FPS
    benchmark.extra_info["correct"] = bool(ran and result.chunks > 0 and not result.error)
    lateness = summary["lateness_ms"]
    benchmark.extra_info["target_met"] = bool(
        lateness["p99"] is not None and lateness["p99"] <= P99_TARGET_MS and lateness["max"] <= MAX_TARGET_MS
    )
    assert not result.error, result.error
    assert result.chunks > 0
